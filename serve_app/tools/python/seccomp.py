"""The seccomp filter of the python sandbox: a deny list of kernel interfaces code never needs.

Built with libseccomp (through `pyseccomp`) as a BPF program that bubblewrap loads right before
it runs the interpreter (`bwrap --seccomp FD`). Everything not listed stays allowed (threads,
subprocesses, files, sockets on the sandbox's own loopback): the namespaces and rlimits do the
confining; this shrinks the kernel surface reachable from inside, as Docker's default profile
does. Calls of another architecture (x32, i386) kill the process (libseccomp's default).
"""

from __future__ import annotations

import errno
import tempfile

# Denied with EPERM: namespaces and mounts (no way out of the sandbox's own), kernel keyrings,
# BPF, perf, io_uring, userfaultfd (a favourite of kernel exploits), module and kexec loading,
# clocks, swap, quotas, reboot, tracing and reading other processes' memory, file handles that
# bypass path checks.
DENIED = (
    "acct", "add_key", "bpf", "chroot", "clock_adjtime", "clock_settime", "create_module", "delete_module",
    "fanotify_init", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "init_module",
    "io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load",
    "keyctl", "lookup_dcookie", "mount", "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pidfd_getfd", "pivot_root", "process_madvise",
    "process_vm_readv", "process_vm_writev", "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot",
    "request_key", "setdomainname", "sethostname", "setns", "settimeofday", "swapoff", "swapon", "syslog", "sysfs",
    "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vhangup",
)  # fmt: skip

# clone() with a namespace flag is refused; clone3() passes its flags in memory a filter cannot
# read, so it reports ENOSYS and the C library falls back to clone() (as Docker's profile does).
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
# Socket families other than AF_UNIX (1), AF_INET (2) and AF_INET6 (10): netlink, packet, alg,
# vsock, ... are kernel code a notebook has no use for.
ALLOWED_SOCKET_FAMILIES = frozenset({1, 2, 10})
AF_MAX = 64
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # push input into a terminal


def seccomp_program() -> bytes:
    """The filter as a BPF program (bytes for `bwrap --seccomp`). Needs libseccomp.so.2."""
    import pyseccomp as seccomp  # type: ignore[import-untyped]

    deny = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED:
        try:
            rules.add_rule(deny, name)
        except (ValueError, RuntimeError, OSError):  # not a system call of this architecture
            continue
    for flag in NAMESPACE_FLAGS:
        rules.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for family in range(AF_MAX):
        if family not in ALLOWED_SOCKET_FAMILIES:
            rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, family))
    for request in (TIOCSTI, TIOCLINUX):
        rules.add_rule(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    with tempfile.TemporaryFile() as program:
        rules.export_bpf(program)
        program.seek(0)
        return program.read()

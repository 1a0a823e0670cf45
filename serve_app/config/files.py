"""Uploaded files (the Files API) and `input_file`: where contents live, how much a tenant may
keep, and how much of a file a model reads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from serve_app.config.base import Strict
from serve_app.state.blobs import BlobStore, LocalBlobStore, S3BlobStore
from serve_app.state.files import DEFAULT_TTL_S, FileLimits

MiB = 1024 * 1024


class BlobConfig(Strict):
    """Where the files' contents are kept.

    local: a directory. Every ingress replica must see the same one: one machine (the demo,
      `responses-serve run`), or a shared filesystem mounted at `path` on every node (NFS, a
      Kubernetes ReadWriteMany volume).
    s3: an S3-compatible object store (MinIO, AWS S3, Ceph RGW, ...): any number of nodes.
    """

    type: Literal["local", "s3"] = Field("local", description="the backend, see above")
    path: str = Field("/tmp/responses-serve/files", min_length=1, description="local: the directory (created if missing)")
    endpoint: str | None = Field(None, description="s3: the server's host:port (e.g. minio:9000, s3.amazonaws.com)")
    bucket: str = Field("responses-serve-files", min_length=3, max_length=63, description="s3: the bucket (created if missing)")
    key_prefix: str = Field("", description="s3: prefix of every object name (apps sharing a bucket differ here)")
    secure: bool = Field(True, description="s3: https (false: plain http, a server on a private network only)")
    region: str | None = Field(None, description="s3: the bucket's region, if the server needs one")
    access_key_env: str = Field("S3_ACCESS_KEY", description="s3: the environment variable holding the access key")
    secret_key_env: str = Field("S3_SECRET_KEY", description="s3: the environment variable holding the secret key")
    timeout_s: float = Field(60.0, gt=0, description="every call of the file store (a whole upload's transfer too) ends within this")

    @model_validator(mode="after")
    def _s3_has_an_endpoint(self) -> BlobConfig:
        if self.type == "s3" and not self.endpoint:
            raise ValueError("files.blob.type 's3' needs files.blob.endpoint (host:port of the S3 server)")
        return self

    def blob_store(self, environ: Mapping[str, str] | None = None) -> BlobStore:
        """The backend this config names; the S3 keys are read from `environ` (default: this process's)."""
        if self.type == "local":
            return LocalBlobStore(self.path, timeout_s=self.timeout_s)
        env = os.environ if environ is None else environ
        assert self.endpoint is not None  # checked above
        return S3BlobStore(
            self.endpoint,
            self.bucket,
            access_key=env.get(self.access_key_env),
            secret_key=env.get(self.secret_key_env),
            secure=self.secure,
            region=self.region,
            prefix=self.key_prefix,
            timeout_s=self.timeout_s,
        )


class FileInputConfig(Strict):
    """How much of a file (`input_file`: by `file_id`, `file_data` or `file_url`) a model reads;
    past a bound, a 400 naming it."""

    max_bytes: int = Field(32 * MiB, ge=1024, description="bytes of one file read for a model")
    max_pages: int = Field(500, ge=1, description="pages of one PDF (a PDF with more is refused before any page is read)")
    max_chars: int = Field(500_000, ge=1000, description="characters of one file's text")
    max_inflated_bytes: int = Field(64 * MiB, ge=MiB, description="bytes one compressed PDF stream may inflate to (decompression bombs)")
    timeout_s: float = Field(30.0, gt=0, description="longest the text of one file may take to extract (in a worker thread)")
    fetch_urls: bool = Field(True, description="read `file_url` (under the egress policy: public addresses only, redirects checked)")
    fetch_timeout_s: float = Field(30.0, gt=0, description="longest a `file_url` fetch may take, redirects included")
    allow_hosts: list[str] = Field(
        default_factory=list,
        description="host names, addresses and networks (CIDR) a `file_url` may reach although they are not public (the browser's --allow-hosts)",
    )


class FilesConfig(Strict):
    """The Files API (`/v1/files`) and `input_file`."""

    blob: BlobConfig = Field(default_factory=BlobConfig, description="where the files' contents are kept")
    max_file_bytes: int = Field(512 * MiB, ge=1024, description="bytes of one upload (413 past it; OpenAI: 512 MB)")
    max_bytes_per_tenant: int = Field(10 * 1024 * MiB, ge=1024, description="bytes of files one tenant keeps (400 past it)")
    max_files_per_tenant: int = Field(10_000, ge=1, description="files one tenant keeps (400 past it)")
    ttl_s: float = Field(DEFAULT_TTL_S, gt=0, description="how long a file is kept (an upload's `expires_after` may shorten it)")
    upload_timeout_s: float = Field(600.0, gt=0, description="an upload not received whole within this is a 408")
    input: FileInputConfig = Field(default_factory=FileInputConfig, description="how much of a file a model reads (`input_file`)")

    def limits(self) -> FileLimits:
        return FileLimits(self.max_file_bytes, self.max_bytes_per_tenant, self.max_files_per_tenant)

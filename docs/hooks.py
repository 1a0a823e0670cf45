"""mkdocs hook: publish the benchmark plots of bench/results/ with the site, so that the
benchmarks page shows the committed plots without a second copy under docs/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def on_files(files: Files, config) -> Files:
    for plot in sorted((ROOT / "bench" / "results").glob("*.png")):
        files.append(
            File(
                str(plot.relative_to(ROOT)), src_dir=str(ROOT), dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]
            )
        )
    return files

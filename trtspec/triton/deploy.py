"""`trtspec deploy`: an engine dir becomes a Triton model repository, everything read from its manifest.

Two flavours keep one client contract (`trtspec.triton.contract`): `cpu` hosts the trtspec runtime on ONNX
Runtime in Python-backend models; `trtllm` writes tensorrtllm_backend's `inflight_batcher_llm` layout for a
TensorRT-LLM engine. The repository is written to a temporary sibling and renamed into place on success.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trtspec.engine.integrity import verify_files
from trtspec.engine.manifest import read_manifest
from trtspec.errors import RepositoryError
from trtspec.outdir import atomic_output_dir
from trtspec.triton.cpu_repo import write_cpu_repository
from trtspec.triton.deploy_options import DeployOptions, check_options, resolve_flavour
from trtspec.triton.trtllm_repo import write_trtllm_repository

log = logging.getLogger(__name__)


def deploy(options: DeployOptions) -> Path:
    """Write the repository; return its path."""
    engine_dir = Path(options.engine_dir)
    manifest = read_manifest(engine_dir)
    verify_files(engine_dir, manifest.checksums)  # never package an engine whose files changed after its build
    flavour = resolve_flavour(manifest, options.flavour)
    batch = check_options(manifest, options)
    write = write_cpu_repository if flavour == "cpu" else write_trtllm_repository
    with atomic_output_dir(Path(options.out), force=options.force) as staging:
        write(manifest, options, staging, batch)
        leftover = [p for p in staging.rglob("*") if p.is_file() and p.suffix in (".pbtxt", ".py", ".json", ".sh")
                    and "${" in p.read_text(errors="replace")]
        if leftover:
            raise RepositoryError(f"unfilled template placeholder left in {leftover[0].relative_to(staging)}")
    log.info("wrote %s repository %s", flavour, options.out)
    return Path(options.out)

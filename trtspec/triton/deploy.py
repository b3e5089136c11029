"""`trtspec deploy`: an engine dir becomes a Triton model repository, everything read from its manifest.

Two flavours keep one client contract (`trtspec.triton.contract`): `cpu` hosts the trtspec runtime on ONNX
Runtime in Python-backend models; `trtllm` writes tensorrtllm_backend's `inflight_batcher_llm` layout for a
TensorRT-LLM engine, or for one planned by `build --plan-only` (its engine files still to come: the repository is
complete but for them, and `doctor` lists them). The repository is written to a temporary sibling and renamed into
place on success.
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
    if flavour == "trtllm":
        _warn_if_planned(engine_dir, manifest)
    return Path(options.out)


def _warn_if_planned(engine_dir: Path, manifest) -> None:
    from trtspec.engine.trtllm_builder import expected_engine_files, is_planned, read_plan

    if not is_planned(engine_dir):
        return
    missing = [f for f in expected_engine_files(manifest.world_size) if not (engine_dir / f).is_file()]
    command = read_plan(engine_dir).get("command_line")
    log.warning("%s is a planned engine: the repository is complete except its engine files (%s), which "
                "trtllm-build writes there on the GPU host%s; `trtspec doctor` lists them until they exist",
                engine_dir, ", ".join(missing), f" (`{command}`)" if command else "")

"""Triton Inference Server: model repositories per flavour (deploy), the real server (serve), clients, doctor and the
OpenAI-compatible frontend."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "deploy_repository": "trtspec.triton.deploy:deploy", "DeployOptions": "trtspec.triton.deploy_options",
    "LlmapiOptions": "trtspec.triton.deploy_options", "parse_draft_len_schedule": "trtspec.triton.deploy_options",
    "deploy_llmapi": "trtspec.triton.llmapi_repo",
    "check_llmapi_drafter": "trtspec.triton.llmapi_check:check_drafter",
    "eagle3_capture": "trtspec.triton.llmapi_check",
    "check_repository": "trtspec.triton.doctor:doctor", "doctor_report": "trtspec.triton.doctor:report",
    "ServerOptions": "trtspec.triton.server", "TritonServer": "trtspec.triton.server",
    "exit_status": "trtspec.triton.server",
    "OpenAIServer": "trtspec.triton.openai_frontend", "OpenAIFrontend": "trtspec.triton.openai_frontend",
    "generate_remote": "trtspec.triton.client",
    "is_model_repository": "trtspec.triton.repo_summary", "repository_summary": "trtspec.triton.repo_summary",
})

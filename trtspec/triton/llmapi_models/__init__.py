"""The Python-backend model of the llmapi repository, copied as `tensorrt_llm/1/model.py` by deploy.

trtspec's own code, as for the trtllm flavour's Python models: it follows the contract of tensorrtllm_backend's
llmapi model (model.yaml or $LLM_CONFIG_PATH, its `triton_config` section dropped and the rest passed to
`LLM(**args)`; the tensors of its config.pbtxt) and runs inside the Triton TensorRT-LLM container, so nothing
here imports it.
"""

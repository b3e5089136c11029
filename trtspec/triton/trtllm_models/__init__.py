"""Python-backend model sources of the GPU (TensorRT-LLM) repository, copied as `<model>/1/model.py` by deploy.

trtspec's own code for its client contract (`trtspec.triton.contract`): they run inside the Triton container
(`triton_python_backend_utils`, numpy, transformers' AutoTokenizer), so nothing here imports them.
"""

"""The pipeline's stages as Prefect tasks, one module each: data, device, training, smoke gate, evaluate,
export, quantize.
"""

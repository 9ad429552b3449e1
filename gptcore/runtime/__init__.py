"""What a run runs on: the device and precision, the heap, FLOPs and throughput, memory estimates and the
batch size that fits.
"""

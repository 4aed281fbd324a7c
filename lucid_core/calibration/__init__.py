"""Calibration kit: measure exclusive and co-located training speed on real GPUs.

Workloads (``workloads/``) are small PyTorch training loops on generated data; the harness runs
them alone and in pairs through a runtime executor, samples NVML, and writes a packing catalog
in the Lucid artifact's format so the packing tree can be trained on the user's own hardware.
Nothing here imports torch at module load: torch is the optional ``workloads`` extra.
"""

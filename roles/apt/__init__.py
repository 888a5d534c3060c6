"""The node's package sources: apt's proxy (proxy), NVIDIA's CUDA repository and the packages
held at exact versions from it (cuda_repo), the pin sets' apt preferences (pinsets). Files:
files/apt/.
"""

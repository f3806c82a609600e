"""The autoscaling policy's Ray adapter (the pure policy: llmserve/policies/autoscaling.py)."""

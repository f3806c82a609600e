"""The Router: the ingress deployment. Keys and tenants, admission (rate limits, the
per-model priority queue, deadlines), the relay of each reply, the shield's map for HAProxy.
"""

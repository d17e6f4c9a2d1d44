"""The memory agent: prompt templates, memory policies and the one batched agent loop that serves
rollout and evaluation alike."""

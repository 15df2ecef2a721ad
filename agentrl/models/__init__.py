"""Model code shared by rollout and training: the hand-written Qwen2/Llama decoder.

- `static_decode`: `StaticDecoder` (the engine's decode step on preallocated caches),
  `DecoderWeights`, `unsupported_reason`, and the helpers both sides use (`call_compiled`,
  `mark_dynamic`, `cat_bias`).
- `static_forward`: the learner's training forward on the same decoder (`forward_hidden`).
- `sampling`: the seeded per-row sampler (`sample_next`, `row_uniforms`) that the decode step
  compiles into one graph with the decoder.

The embedded tiny model builder and `load_model` stay in `agentrl.models.tiny`. Nothing here imports
`agentrl.rollout`, `agentrl.learner.local` or `agentrl.train`.
"""

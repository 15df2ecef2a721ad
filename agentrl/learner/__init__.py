"""The learner: teacher-forced logprobs and the update (`local`, `forward`, `optim`, `stats`),
N FSDP2 ranks and their group (`rank`, `group`, `dist`), frozen reference/teacher models and
workers (`frozen`), checkpoints, schedules, LoRA, prefix sharing and the fused head. It imports
no algorithm and no rollout code: the algorithm object arrives from the caller."""

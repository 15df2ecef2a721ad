"""Reward sources any env can stack: an AI judge (RLAIF), reward and safety classifiers, and an
intrinsic-curiosity bonus, each a Gymnasium wrapper that logs its part in
`info["reward_components"]` (docs/rewards.md).

Importing this package imports no torch or transformers; models load when a component is built.
"""

from agentrl.rewards.classifier import (
    ClassifierReward,
    LagrangeMultiplier,
    SafetyReward,
    SequenceClassifier,
    load_classifier,
)
from agentrl.rewards.curiosity import (
    CountNovelty,
    CuriosityBonus,
    CuriosityMemory,
    RNDNovelty,
    hashing_embedding,
    ngram_buckets,
)
from agentrl.rewards.functions import RewardBatch, call_reward_fn
from agentrl.rewards.judge import (
    DEFAULT_TEMPLATE,
    PAIRWISE_TEMPLATE,
    JudgeClient,
    JudgeResult,
    PairResult,
    RuleJudge,
    make_judge,
)
from agentrl.rewards.lexicon import LexiconSafetyClassifier
from agentrl.rewards.parse import (
    VERDICT_WORDS,
    parse_judge_score,
    parse_pairwise_choice,
    strip_think,
)
from agentrl.rewards.serve_judge import serve_judge
from agentrl.rewards.wrappers import WRAPPERS, JudgeReward, RewardWrappers, wrap_env

__all__ = [
    "ClassifierReward", "CountNovelty", "CuriosityBonus", "CuriosityMemory", "DEFAULT_TEMPLATE",
    "JudgeClient", "JudgeResult", "JudgeReward", "LagrangeMultiplier", "LexiconSafetyClassifier",
    "PAIRWISE_TEMPLATE", "PairResult", "RNDNovelty", "RewardBatch", "RewardWrappers", "RuleJudge",
    "SafetyReward", "SequenceClassifier", "VERDICT_WORDS", "WRAPPERS", "call_reward_fn",
    "hashing_embedding", "load_classifier", "make_judge", "ngram_buckets", "parse_judge_score",
    "parse_pairwise_choice", "serve_judge", "strip_think", "wrap_env",
]

"""pagedinfer: a paged-KV-cache inference engine with continuous batching."""

from pagedinfer.engine import LLMEngine, RequestOutput
from pagedinfer.sampling import SamplingParams

__all__ = ["LLMEngine", "RequestOutput", "SamplingParams"]

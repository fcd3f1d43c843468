"""Type stubs of the native module ``decide._native`` (Rust, PyO3); ``decide`` wraps it."""

from typing import Any, List, Optional, Tuple

DEFAULT_MODEL: str
BM25_MODEL: str
__version__: str

class DecideError(ValueError):
    """A decision could not be made: bad input, a model that cannot be loaded, or a model that
    failed. The message is the one line ``decide`` prints."""

_ToolRow = Tuple[str, Optional[float], str, bool]
_GateRow = Tuple[Optional[float], float, bool]
_Thresholds = Tuple[float, Optional[float], Optional[float]]

class Decider:
    def __init__(
        self, model: Optional[str] = None, device: str = "cpu", dtype: str = "f32"
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> Optional[str]: ...
    def select(
        self,
        messages: Any,
        tools: Any,
        *,
        min_probability: Optional[float] = None,
        target_recall: Optional[float] = None,
        max_results: Optional[int] = None,
        always_include: List[str] = ...,
        needs_tool_gate: Optional[bool] = None,
        fallback: Optional[str] = None,
        max_messages: Optional[int] = None,
        max_message_length: Optional[int] = None,
    ) -> Tuple[List[_ToolRow], Optional[_GateRow], Optional[Tuple[str, str]], _Thresholds]: ...
    def route(
        self,
        messages: Any,
        routes: Any,
        *,
        default: Optional[str] = None,
        min_probability: Optional[float] = None,
        max_messages: Optional[int] = None,
    ) -> Tuple[str, List[Tuple[str, float]], str]: ...
    def embed(self, texts: Any, *, truncate: bool = False) -> List[List[float]]: ...
    def rerank(
        self, query: str, documents: Any
    ) -> Tuple[str, str, List[Tuple[int, float, float]]]: ...

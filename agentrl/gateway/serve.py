"""`agentrl serve --model DIR`: the gateway's endpoint for a checkpoint outside training, so an
agent can be tried and evaluated with its own harness before and after RL.

The model is a Hugging Face directory, a checkpoint `OUT/checkpoints/step_N` or a training
output dir (its newest checkpoint), loaded as `agentrl eval` does (`resolve_model`,
`make_engine`: the hf engine, or vLLM with `rollout.engine=vllm`). The server listens on
127.0.0.1 only; with `api_key` a request must carry it, without one any key (or none) is taken.
Requests sample with their own `temperature` / `top_p` (default 1.0); nothing is recorded.
It serves one model, `policy` (the name an agent uses in training too): `GET /v1/models` lists
only it, and a request for another name is refused (404 `model_not_found`, naming `policy`).
"""

from __future__ import annotations

import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import Config, load_config
from agentrl.eval.cli import resolve_model
from agentrl.gateway.agents import MODEL_NAME
from agentrl.gateway.server import Gateway, Session
from agentrl.rollout.chat import renderer_for
from agentrl.rollout.engines.make import make_engine
from agentrl.rollout.tool_format import tool_parser_for
from agentrl_tools.parser import get_parser


@dataclass
class Served:
    """A running `serve`: the gateway, its session, and the thread that samples."""

    gateway: Gateway
    session: Session
    thread: threading.Thread
    stop: threading.Event
    tool_parser: str = "hermes"
    tool_parser_why: str = ""
    model_dir: str = ""
    """The directory loaded: `model`'s newest checkpoint when it is a run folder (`resolve_model`)."""

    @property
    def url(self) -> str:
        return self.gateway.url

    def close(self) -> None:
        """Stop sampling and the server."""
        self.stop.set()
        self.thread.join(timeout=10)
        self.session.fail_waiting()
        self.gateway.close()


def run_template_kwargs(run_config: str | Path) -> dict[str, Any]:
    """`rollout.chat_template_kwargs` of a training run's `OUT/config.json`, read as `agentrl
    eval` reads it (`load_config`; {} when it has none or the file is not a valid config)."""
    try:
        return dict(load_config(run_config).rollout.chat_template_kwargs)
    except (OSError, ValueError):  # a missing or unreadable file; ConfigError is a ValueError
        return {}


def start(model: str | Path, *, port: int = 0, api_key: str | None = None,
          tool_parser: str = "auto", max_tokens: int = 1024, max_context: int = 4096,
          cfg: Config | None = None, engine: Any = None, tokenizer: Any = None,
          template_kwargs: dict[str, Any] | None = None) -> Served:
    """Load `model` and serve it on `127.0.0.1:port` (0: a free port).

    Args:
        tool_parser: the model's tool-call format: a name in `agentrl_tools.parser.PARSERS`, or
            `auto` (default): read from the model's tokenizer (`detect_tool_parser`, as
            `rollout.tool_parser=auto` does in training).
        max_tokens: the most new tokens per call; max_context: the most tokens of a prompt and
            its completion.
        cfg: the settings of the engine (default: `Config()`, the hf engine in float32).
        engine, tokenizer: an engine already built (tests, benchmarks): `model` only names it.
        template_kwargs: the chat template's variables (e.g. `{"enable_thinking": false}`);
            None: a training run's own `rollout.chat_template_kwargs` when `model` is a run
            folder or one of its checkpoints (what it was trained with), else none. A request's
            `chat_template_kwargs` must agree with them (400 otherwise).

    Raises:
        FileNotFoundError: `model` is no model directory, checkpoint or run dir.
        ValueError: an unknown tool parser; a tokenizer without a chat template.
        OSError: the port is taken (naming `127.0.0.1:port`).
    """
    if tool_parser != "auto":
        get_parser(tool_parser)  # an unknown name fails before the model loads
    gw = Gateway(port, serving=True)  # so does a port in use
    try:
        session, tool_parser, why, model_dir = _session(model, tool_parser, max_tokens, max_context,
                                                        cfg, engine, tokenizer, template_kwargs)
    except BaseException:
        gw.close()
        raise
    if api_key:
        gw.open_run(session, record=False, token=api_key)
    else:
        gw.open_to_all(session)
    stop = threading.Event()
    thread = threading.Thread(target=_drive, args=(session, stop), name="agentrl-serve", daemon=True)
    thread.start()
    return Served(gw, session, thread, stop, tool_parser, why, str(model_dir))


def _session(model: str | Path, tool_parser: str, max_tokens: int, max_context: int, cfg: Config | None,
             engine: Any, tokenizer: Any, template_kwargs: dict[str, Any] | None = None
             ) -> tuple[Session, str, str, str | Path]:
    """`start`'s model loaded (unless `engine` is given) in a `Session`: `(session, tool parser,
    why that parser, the directory loaded)`."""
    model_dir = model
    if engine is None:
        model_dir, run_cfg = resolve_model(str(model))
        if template_kwargs is None and run_cfg is not None:
            template_kwargs = run_template_kwargs(run_cfg)
        engine, tokenizer = make_engine(cfg or Config(), str(model_dir))
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{model}: the tokenizer has no chat template (serve renders each request's "
                         "messages with it): set chat_template in its tokenizer_config.json or add a "
                         "chat_template.jinja beside it")
    tool_parser, why = tool_parser_for(tool_parser, tokenizer, source="--tool-parser")
    parser = get_parser(tool_parser)
    session = Session(engine, renderer_for(tokenizer, template_kwargs=template_kwargs), parser,
                      model_names=[MODEL_NAME],
                      max_episode_tokens=max_context, max_tokens=max_tokens, sampling=None,
                      seed=None, batch_wait_s=0.002, start_wait_s=0.0)
    return session, tool_parser, why, model_dir


def _drive(session: Session, stop: threading.Event) -> None:
    """Sample the session's requests until `stop`; an engine failure fails its requests (500)
    and is printed, and the server goes on."""
    while not stop.is_set():
        try:
            session.step()
        except Exception:  # noqa: BLE001 - the requests got the error; serve the next ones
            traceback.print_exc(file=sys.stderr)

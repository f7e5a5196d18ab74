"""ds4d client over libds4client's C ABI (client/ds4client.h).

    import ds4
    with ds4.Client() as c:                       # $DS4_SOCKET or the default socket
        for chunk in c.generate("def fib(n):", max_tokens=32):
            print(chunk.text, end="", flush=True)

A Client is one connection; use it from one thread at a time.
"""
import codecs
import ctypes as C
import queue
import threading
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence

from ._lib import Ds4Error, cstr, fn, load

OK, ERR_ARG, ERR_CONNECT, ERR_PROTOCOL, ERR_SERVER = 0, 1, 2, 3, 4
FINISH_REASONS = {0: "stop", 1: "stop_string", 2: "length", 3: "context", 4: "cancelled"}


class ConnectError(Ds4Error):
    """ds4d could not be reached."""


class ServerError(Ds4Error):
    """ds4d answered with an error; server_code is the protocol's ErrorCode value."""

    def __init__(self, message, code, server_code):
        super().__init__(message, code)
        self.server_code = server_code


class _ModelInfo(C.Structure):
    _fields_ = [("protocol_version", C.c_uint32), ("family", C.c_char * 32), ("name", C.c_char * 64),
                ("backend", C.c_char * 16), ("n_layer", C.c_uint32), ("n_embd", C.c_uint32),
                ("n_vocab", C.c_uint32), ("n_ctx_max", C.c_uint32), ("n_head", C.c_uint32),
                ("n_expert", C.c_uint32), ("default_ctx", C.c_uint32)]


class _GenOptions(C.Structure):
    _fields_ = [("session", C.c_uint64), ("text", C.c_char_p), ("text_len", C.c_size_t),
                ("tokens", C.POINTER(C.c_int32)), ("n_tokens", C.c_size_t),
                ("chat_roles", C.POINTER(C.c_char_p)), ("chat_contents", C.POINTER(C.c_char_p)),
                ("chat_content_lens", C.POINTER(C.c_size_t)), ("n_chat", C.c_size_t),
                ("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float), ("min_p", C.c_float),
                ("seed", C.c_uint64), ("max_tokens", C.c_uint32),
                ("stop_strings", C.POINTER(C.c_char_p)), ("n_stop_strings", C.c_size_t),
                ("stop_tokens", C.POINTER(C.c_int32)), ("n_stop_tokens", C.c_size_t),
                ("ignore_eos", C.c_int32), ("thinking", C.c_int32), ("request_id_out", C.POINTER(C.c_uint64))]


class _Done(C.Structure):
    _fields_ = [("request_id", C.c_uint64), ("reason", C.c_int32), ("prompt_tokens", C.c_uint32),
                ("cached_tokens", C.c_uint32), ("generated_tokens", C.c_uint32), ("prefill_us", C.c_uint64),
                ("decode_us", C.c_uint64), ("stop_token", C.c_int32)]


class _Stats(C.Structure):
    _fields_ = [("uptime_s", C.c_double), ("sessions", C.c_uint32), ("connections", C.c_uint32),
                ("active_requests", C.c_uint32), ("queued_requests", C.c_uint32), ("requests_total", C.c_uint64),
                ("tokens_in", C.c_uint64), ("tokens_cached", C.c_uint64), ("tokens_out", C.c_uint64),
                ("prefill_tok_s", C.c_double), ("decode_tok_s", C.c_double), ("weights_bytes", C.c_uint64),
                ("cache_bytes", C.c_uint64), ("scratch_bytes", C.c_uint64), ("device_free", C.c_uint64),
                ("device_total", C.c_uint64)]


class _StatsEx(C.Structure):
    # ds4c_stats_ex: ds4c_stats plus the batching, speculation and budget figures (size-versioned).
    _fields_ = [("size", C.c_size_t), ("base", _Stats), ("saves_failed", C.c_uint64),
                ("device_weights_bytes", C.c_uint64), ("device", C.c_char * 64), ("steps", C.c_uint64),
                ("step_rows", C.c_uint64), ("step_requests", C.c_uint64), ("step_seconds", C.c_double),
                ("max_batch", C.c_uint32), ("step_tokens", C.c_uint32), ("draft_max", C.c_uint32),
                ("spec_trials", C.c_uint64), ("spec_drafted", C.c_uint64), ("spec_accepted", C.c_uint64),
                ("spec_fallbacks", C.c_uint64), ("spec_tokens", C.c_uint64), ("spec_solo_tokens", C.c_uint64),
                ("spec_solo_seconds", C.c_double), ("solo_steps", C.c_uint64), ("solo_seconds", C.c_double),
                ("kv_budget", C.c_uint64), ("kv_in_use", C.c_uint64), ("kv_refused", C.c_uint64),
                ("kv_waiting", C.c_uint32), ("slot_waiting", C.c_uint32),
                ("drafter_bytes", C.c_uint64), ("shared_bytes", C.c_uint64), ("private_bytes", C.c_uint64),
                ("streaming", C.c_int32), ("expert_acquired", C.c_uint64), ("expert_misses", C.c_uint64),
                ("expert_late", C.c_uint64), ("expert_prefetched", C.c_uint64), ("expert_prefetch_used", C.c_uint64),
                ("expert_bytes_read", C.c_uint64), ("expert_resident", C.c_uint64), ("expert_capacity", C.c_uint64),
                ("expert_wait_s", C.c_double), ("expert_io_busy_s", C.c_double)]


class _SessionEntry(C.Structure):
    _fields_ = [("name", C.c_char_p), ("save_error", C.c_char_p), ("n_tokens", C.c_uint32),
                ("stored_tokens", C.c_uint32), ("bytes", C.c_uint64), ("created_unix", C.c_uint64),
                ("last_used_unix", C.c_uint64), ("pinned", C.c_int32), ("live", C.c_int32)]


class _Controls(C.Structure):
    _fields_ = [("size", C.c_size_t), ("repeat_penalty", C.c_float), ("repeat_last_n", C.c_int32),
                ("frequency_penalty", C.c_float), ("presence_penalty", C.c_float),
                ("logit_bias_tokens", C.POINTER(C.c_int32)), ("logit_bias_values", C.POINTER(C.c_float)),
                ("n_logit_bias", C.c_size_t), ("logprobs", C.c_int32), ("top_logprobs", C.c_uint32),
                ("json_object", C.c_int32)]


class _TokenLogprob(C.Structure):
    _fields_ = [("logprob", C.c_float), ("top_tokens", C.POINTER(C.c_int32)), ("top_logprobs", C.POINTER(C.c_float)),
                ("n_top", C.c_size_t)]


_CHUNK_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_int32), C.c_size_t, C.POINTER(C.c_char), C.c_size_t)
_CHUNK_EX_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_int32), C.c_size_t, C.POINTER(C.c_char), C.c_size_t,
                           C.POINTER(_TokenLogprob))

# The libds4client ABI these bindings are written for (client/CMakeLists.txt SOVERSION).
LIBDS4CLIENT_SONAME = "libds4client.so.3"

_lib = None


def _api():
    global _lib
    if _lib is not None:
        return _lib
    L = load(LIBDS4CLIENT_SONAME, "DS4CLIENT_LIBRARY")
    E = (C.c_char_p, C.c_size_t)
    P = C.c_void_p
    fn(L, "ds4c_connect", C.c_int, C.POINTER(P), C.c_char_p, *E)
    fn(L, "ds4c_free", None, P)
    fn(L, "ds4c_server_error_code", C.c_int, P)
    fn(L, "ds4c_get_model_info", C.c_int, P, C.POINTER(_ModelInfo), *E)
    fn(L, "ds4c_open_session", C.c_int, P, C.c_char_p, C.c_uint32, C.POINTER(C.c_uint64), C.POINTER(C.c_uint32), *E)
    fn(L, "ds4c_close_session", C.c_int, P, C.c_uint64, *E)
    fn(L, "ds4c_generate_options_init", None, C.POINTER(_GenOptions))
    fn(L, "ds4c_generate", C.c_int, P, C.POINTER(_GenOptions), _CHUNK_FN, P, C.POINTER(_Done), *E)
    fn(L, "ds4c_sampling_controls_init", None, C.POINTER(_Controls), C.c_size_t)
    fn(L, "ds4c_generate_ex", C.c_int, P, C.POINTER(_GenOptions), C.POINTER(_Controls), _CHUNK_EX_FN, P,
       C.POINTER(_Done), *E)
    fn(L, "ds4c_cancel", C.c_int, P, C.c_uint64, *E)
    fn(L, "ds4c_tokenize", C.c_int, P, C.c_char_p, C.c_size_t, C.POINTER(C.c_int32), C.c_size_t,
       C.POINTER(C.c_size_t), *E)
    fn(L, "ds4c_detokenize", C.c_int, P, C.POINTER(C.c_int32), C.c_size_t, C.c_char_p, C.c_size_t,
       C.POINTER(C.c_size_t), *E)
    fn(L, "ds4c_get_stats", C.c_int, P, C.POINTER(_Stats), *E)
    fn(L, "ds4c_stats_ex_init", None, C.POINTER(_StatsEx), C.c_size_t)
    fn(L, "ds4c_get_stats_ex", C.c_int, P, C.POINTER(_StatsEx), *E)
    fn(L, "ds4c_model_has_chat_template", C.c_int, P)
    fn(L, "ds4c_list_sessions", C.c_int, P, C.POINTER(P), *E)
    fn(L, "ds4c_session_list_count", C.c_size_t, P)
    fn(L, "ds4c_session_list_get", C.c_int, P, C.c_size_t, C.POINTER(_SessionEntry))
    fn(L, "ds4c_session_list_free", None, P)
    fn(L, "ds4c_save_session", C.c_int, P, C.c_char_p, C.c_uint64, C.POINTER(C.c_uint32), C.POINTER(C.c_uint64), *E)
    fn(L, "ds4c_load_session", C.c_int, P, C.c_char_p, C.c_uint32, C.POINTER(C.c_uint64), C.POINTER(C.c_uint32), *E)
    fn(L, "ds4c_delete_session", C.c_int, P, C.c_char_p, *E)
    _lib = L
    return L


@dataclass
class ModelInfo:
    family: str
    name: str
    backend: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_max: int
    n_head: int
    n_expert: int
    default_ctx: int
    protocol_version: int
    chat_template: bool = True   # the GGUF has a chat template; False: a plain completion model


@dataclass
class Chunk:
    text: str
    tokens: List[int]
    # With generate(logprobs=True): per token, (logprob, [(token id, logprob), ...] of the
    # top_logprobs most likely), under the distribution sampled from (ds4client.h says which).
    logprobs: List[tuple] = field(default_factory=list)


@dataclass
class Done:
    reason: str               # stop, stop_string, length, context, cancelled
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    prefill_us: int
    decode_us: int
    stop_token: int
    request_id: int


@dataclass
class Stats:
    uptime_s: float
    sessions: int
    connections: int
    active_requests: int
    queued_requests: int
    requests_total: int
    tokens_in: int
    tokens_cached: int
    tokens_out: int
    prefill_tok_s: float
    decode_tok_s: float
    weights_bytes: int
    cache_bytes: int
    scratch_bytes: int
    device_free: int
    device_total: int
    # ds4c_stats_ex's figures (docs in client/ds4client.h)
    saves_failed: int = 0
    device_weights_bytes: int = 0
    device: str = ""
    steps: int = 0
    step_rows: int = 0
    step_requests: int = 0
    step_seconds: float = 0.0
    max_batch: int = 0
    step_tokens: int = 0
    draft_max: int = 0
    spec_trials: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_fallbacks: int = 0
    spec_tokens: int = 0
    spec_solo_tokens: int = 0
    spec_solo_seconds: float = 0.0
    solo_steps: int = 0
    solo_seconds: float = 0.0
    kv_budget: int = 0
    kv_in_use: int = 0
    kv_refused: int = 0
    kv_waiting: int = 0
    slot_waiting: int = 0
    drafter_bytes: int = 0
    shared_bytes: int = 0
    private_bytes: int = 0
    streaming: int = 0
    expert_acquired: int = 0
    expert_misses: int = 0
    expert_late: int = 0
    expert_prefetched: int = 0
    expert_prefetch_used: int = 0
    expert_bytes_read: int = 0
    expert_resident: int = 0
    expert_capacity: int = 0
    expert_wait_s: float = 0.0
    expert_io_busy_s: float = 0.0


@dataclass
class StoredSession:
    name: str
    n_tokens: int
    stored_tokens: int
    bytes: int
    created_unix: int
    last_used_unix: int
    pinned: bool
    live: bool
    save_error: str = ""


class Generation:
    """An iterator over the Chunks of one generation; .done is set once it is exhausted.

    Leaving the loop early (break, or close()) cancels the request on the daemon.
    """

    _END = object()

    def __init__(self, client, opts, controls, keep):
        self._client = client
        self._keep = keep  # ctypes buffers the options point to
        self._q = queue.Queue()
        self._stop = threading.Event()
        self._rid = C.c_uint64(0)
        opts.request_id_out = C.pointer(self._rid)
        self._opts = opts
        self._controls = controls
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.done: Optional[Done] = None
        self._error = None
        self._cb = _CHUNK_EX_FN(self._on_chunk)
        self._thread = threading.Thread(target=self._run, name="ds4-generate", daemon=True)
        self._thread.start()

    def _on_chunk(self, ud, toks, n_toks, text, text_len, lp):
        lps = []
        if lp:
            for i in range(n_toks):
                e = lp[i]
                lps.append((e.logprob, [(e.top_tokens[k], e.top_logprobs[k]) for k in range(e.n_top)]))
        self._q.put((list(toks[:n_toks]) if n_toks else [], C.string_at(text, text_len) if text_len else b"", lps))
        return 1 if self._stop.is_set() else 0

    def _run(self):
        done = _Done()
        err = C.create_string_buffer(1024)
        try:
            rc = _api().ds4c_generate_ex(self._client._h, C.byref(self._opts), C.byref(self._controls), self._cb, None,
                                         C.byref(done), err, len(err))
            if rc != OK:
                self._error = self._client._error(rc, err)
            else:
                self.done = Done(FINISH_REASONS.get(done.reason, str(done.reason)), done.prompt_tokens,
                                 done.cached_tokens, done.generated_tokens, done.prefill_us, done.decode_us,
                                 done.stop_token, done.request_id)
        finally:
            self._q.put(self._END)

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        item = self._q.get()
        if item is self._END:
            self._thread.join()
            self._client._busy = False
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            raise StopIteration
        toks, raw, lps = item
        return Chunk(self._decoder.decode(raw), toks, lps)

    @property
    def request_id(self) -> int:
        return self._rid.value

    def close(self):
        """Cancels the request if it still runs and waits for its end."""
        if not self._thread.is_alive() and self._q.empty():
            return
        self._stop.set()
        if self._rid.value:
            _api().ds4c_cancel(self._client._h, self._rid.value, None, 0)
        for _ in self:
            pass

    def text(self) -> str:
        """Consumes the rest of the generation and returns its text."""
        return "".join(c.text for c in self)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Client:
    """One connection to ds4d. socket None: $DS4_SOCKET, else the default path."""

    def __init__(self, socket: Optional[str] = None):
        self._h = None
        self._busy = False
        h = C.c_void_p()
        err = C.create_string_buffer(1024)
        rc = _api().ds4c_connect(C.byref(h), socket.encode() if socket else None, err, len(err))
        if rc != OK:
            raise self._error(rc, err)
        self._h = h

    def _error(self, rc, err):
        msg = cstr(err.raw)
        if rc == ERR_CONNECT:
            return ConnectError(msg, rc)
        if rc == ERR_SERVER:
            return ServerError(msg, rc, _api().ds4c_server_error_code(self._h))
        return Ds4Error(msg, rc)

    def _call(self, name, *args):
        if self._h is None:
            raise Ds4Error("the client is closed")
        if self._busy:
            raise Ds4Error("a generation is still running on this client: finish or close() it first")
        err = C.create_string_buffer(1024)
        rc = getattr(_api(), name)(self._h, *args, err, len(err))
        if rc != OK:
            raise self._error(rc, err)

    def close(self):
        if self._h is not None:
            _api().ds4c_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def model_info(self) -> ModelInfo:
        mi = _ModelInfo()
        self._call("ds4c_get_model_info", C.byref(mi))
        return ModelInfo(cstr(mi.family), cstr(mi.name), cstr(mi.backend), mi.n_layer, mi.n_embd, mi.n_vocab,
                         mi.n_ctx_max, mi.n_head, mi.n_expert, mi.default_ctx, mi.protocol_version,
                         _api().ds4c_model_has_chat_template(self._h) == 1)

    def open_session(self, name: Optional[str] = None, ctx: int = 0) -> int:
        """A session id: name None for an anonymous session of this connection."""
        sid, n = C.c_uint64(), C.c_uint32()
        self._call("ds4c_open_session", name.encode() if name else None, ctx, C.byref(sid), C.byref(n))
        return sid.value

    def close_session(self, session: int):
        self._call("ds4c_close_session", C.c_uint64(session))

    def generate(self, prompt: Optional[str] = None, *, tokens: Optional[Sequence[int]] = None,
                 messages: Optional[Sequence[dict]] = None, session: int = 0, max_tokens: int = 256,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 seed: Optional[int] = None, stop: Sequence[str] = (), stop_tokens: Sequence[int] = (),
                 thinking: bool = False, ignore_eos: bool = False, repeat_penalty: float = 1.0,
                 repeat_last_n: int = 64, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 logit_bias: Optional[dict] = None, logprobs: bool = False, top_logprobs: int = 0,
                 json_object: bool = False) -> Generation:
        """Streams a generation. Exactly one of prompt (plain text completion), tokens, or
        messages ([{"role": "user", "content": "..."}], the chat template) is given.
        seed None: a random seed. repeat_penalty over the last repeat_last_n tokens of context
        (llama.cpp), frequency/presence penalties over the generated tokens (OpenAI), logit_bias
        {token id: bias}; logprobs fills each Chunk's logprobs (top_logprobs alternatives);
        json_object: the output is one JSON object (constrained decoding)."""
        if self._h is None:
            raise Ds4Error("the client is closed")
        if self._busy:
            raise Ds4Error("a generation is still running on this client: finish or close() it first")
        if sum(x is not None for x in (prompt, tokens, messages)) != 1:
            raise ValueError("give exactly one of prompt, tokens or messages")
        o = _GenOptions()
        _api().ds4c_generate_options_init(C.byref(o))
        keep = []
        if prompt is not None:
            b = prompt.encode()
            o.text, o.text_len = b, len(b)
            keep.append(b)
        elif tokens is not None:
            arr = (C.c_int32 * len(tokens))(*tokens)
            o.tokens, o.n_tokens = C.cast(arr, C.POINTER(C.c_int32)), len(tokens)
            keep.append(arr)
        else:
            roles = [m["role"].encode() for m in messages]
            contents = [m["content"].encode() for m in messages]
            r = (C.c_char_p * len(roles))(*roles)
            c = (C.c_char_p * len(contents))(*contents)
            lens = (C.c_size_t * len(contents))(*[len(x) for x in contents])
            o.chat_roles, o.chat_contents, o.chat_content_lens, o.n_chat = r, c, lens, len(roles)
            keep += [roles, contents, r, c, lens]
        if stop:
            sb = [s.encode() for s in stop]
            sa = (C.c_char_p * len(sb))(*sb)
            o.stop_strings, o.n_stop_strings = sa, len(sb)
            keep += [sb, sa]
        if stop_tokens:
            ta = (C.c_int32 * len(stop_tokens))(*stop_tokens)
            o.stop_tokens, o.n_stop_tokens = C.cast(ta, C.POINTER(C.c_int32)), len(stop_tokens)
            keep.append(ta)
        if seed is None:
            import secrets
            seed = secrets.randbits(64)
        o.session, o.max_tokens, o.temperature, o.top_k, o.top_p, o.min_p = session, max_tokens, temperature, top_k, top_p, min_p
        o.seed, o.thinking, o.ignore_eos = seed, int(thinking), int(ignore_eos)
        x = _Controls()
        _api().ds4c_sampling_controls_init(C.byref(x), C.sizeof(x))
        x.repeat_penalty, x.repeat_last_n = repeat_penalty, repeat_last_n
        x.frequency_penalty, x.presence_penalty = frequency_penalty, presence_penalty
        x.logprobs, x.top_logprobs = int(logprobs), top_logprobs
        x.json_object = int(json_object)
        if logit_bias:
            ids = (C.c_int32 * len(logit_bias))(*logit_bias.keys())
            vals = (C.c_float * len(logit_bias))(*logit_bias.values())
            x.logit_bias_tokens, x.logit_bias_values, x.n_logit_bias = ids, vals, len(logit_bias)
            keep += [ids, vals]
        self._busy = True
        return Generation(self, o, x, keep)

    def complete(self, prompt: Optional[str] = None, **kw) -> str:
        """generate() and return the whole text."""
        return self.generate(prompt, **kw).text()

    def tokenize(self, text: str) -> List[int]:
        b = text.encode()
        n = C.c_size_t()
        cap = max(16, len(b) + 16)
        while True:
            buf = (C.c_int32 * cap)()
            try:
                self._call("ds4c_tokenize", b, len(b), buf, cap, C.byref(n))
                return list(buf[: n.value])
            except Ds4Error as e:
                if e.code == ERR_ARG and n.value > cap:
                    cap = n.value
                    continue
                raise

    def detokenize(self, tokens: Sequence[int]) -> str:
        arr = (C.c_int32 * len(tokens))(*tokens)
        n = C.c_size_t()
        cap = 64 + 16 * len(tokens)
        while True:
            buf = C.create_string_buffer(cap)
            try:
                self._call("ds4c_detokenize", arr, len(tokens), buf, cap, C.byref(n))
                return buf.raw[: n.value].decode("utf-8", "replace")
            except Ds4Error as e:
                if e.code == ERR_ARG and n.value + 1 > cap:
                    cap = n.value + 1
                    continue
                raise

    def stats(self) -> Stats:
        x = _StatsEx()
        _api().ds4c_stats_ex_init(C.byref(x), C.sizeof(x))
        self._call("ds4c_get_stats_ex", C.byref(x))
        extra = {f: getattr(x, f) for f, _ in _StatsEx._fields_ if f not in ("size", "base")}
        extra["device"] = cstr(x.device)
        return Stats(*[getattr(x.base, f) for f, _ in _Stats._fields_], **extra)

    def sessions(self) -> List[StoredSession]:
        """Stored and live named sessions (needs a daemon with a store)."""
        h = C.c_void_p()
        self._call("ds4c_list_sessions", C.byref(h))
        try:
            out = []
            e = _SessionEntry()
            for i in range(_api().ds4c_session_list_count(h)):
                _api().ds4c_session_list_get(h, i, C.byref(e))
                out.append(StoredSession(cstr(e.name), e.n_tokens, e.stored_tokens, e.bytes, e.created_unix,
                                         e.last_used_unix, bool(e.pinned), bool(e.live), cstr(e.save_error)))
            return out
        finally:
            _api().ds4c_session_list_free(h)

    def save_session(self, name: str, session: int = 0) -> int:
        """Makes the session durable under name; returns its token count."""
        n, b = C.c_uint32(), C.c_uint64()
        self._call("ds4c_save_session", name.encode(), C.c_uint64(session), C.byref(n), C.byref(b))
        return n.value

    def load_session(self, name: str, ctx: int = 0) -> int:
        sid, n = C.c_uint64(), C.c_uint32()
        self._call("ds4c_load_session", name.encode(), ctx, C.byref(sid), C.byref(n))
        return sid.value

    def delete_session(self, name: str):
        self._call("ds4c_delete_session", name.encode())

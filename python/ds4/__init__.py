"""ds4 from Python (ctypes; needs the shared libraries from `cmake --install`).

ds4.Client talks to a running ds4d (libds4client); ds4.Model / ds4.Session run the engine in
this process (libds4). The libraries are looked up as described in ds4._lib.
"""
from ._lib import Ds4Error
from .bridge import Model, Session
from .client import Chunk, Client, ConnectError, Done, Generation, ModelInfo, ServerError, Stats, StoredSession

__version__ = "0.1.0"
__all__ = ["Client", "ConnectError", "ServerError", "Ds4Error", "Chunk", "Done", "Generation", "ModelInfo",
           "Stats", "StoredSession", "Model", "Session"]

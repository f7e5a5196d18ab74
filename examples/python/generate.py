"""Continue a text with a running ds4d, streaming it (pip install ./python first).
    python3 generate.py "def fib(n):"       (socket: $DS4_SOCKET or the default)"""
import sys

import ds4

with ds4.Client() as client:
    for chunk in client.generate(sys.argv[1], max_tokens=16, temperature=0):
        print(chunk.text, end="", flush=True)
    print()

#!/usr/bin/env python3
"""Writes the seed corpus of the rendezvous store's fuzzer (tests/fuzz/store_protocol.cpp)
into tests/fuzz/corpus/store_protocol: chunks of (session, length, bytes) for three
connections whose server nonces are 32 bytes of 'a', 'b', 'c'; the right hellos use a
client nonce of 32 'c's and HMAC-SHA256 over runtime/comm/tcp_store.cpp's proof message."""
import hashlib
import hmac
import pathlib
import struct

TOKEN = b"fuzz-token-0123456789"
CLIENT_NONCE = b"c" * 32


def proof(role, session, token=TOKEN):
    msg = b"flowjit-store-v1 " + role + b"\0" + bytes([ord("a") + session]) * 32 + CLIENT_NONCE
    return hmac.new(token, msg, hashlib.sha256).digest()


def hello(session, token=TOKEN):
    return b"A" + CLIENT_NONCE + proof(b"client", session, token)


def set_(key, value):
    return b"S" + struct.pack("<I", len(key)) + key + struct.pack("<Q", len(value)) + value


def get(key):
    return b"G" + struct.pack("<I", len(key)) + key


def chunks(*parts):
    out = b""
    for session, data in parts:
        for at in range(0, max(len(data), 1), 255):
            piece = data[at:at + 255]
            out += bytes([session, len(piece)]) + piece
    return out


CORPUS = {
    "set_get": chunks((0, hello(0) + set_(b"flowjit/session/0/info/0", b"num_processes=2, local_devices=1")),
                      (0, get(b"flowjit/session/0/info/0")), (0, get(b"missing"))),
    "caps": chunks((2, set_(b"a" * 65, b"v")), (1, hello(1) + set_(b"k", b"v" * 300)),
                   (0, hello(0) + b"S" + struct.pack("<I", 1) + b"k" + struct.pack("<Q", 1 << 40))),
    "pipelined": chunks((2, set_(b"big", b"x" * 250)), (2, get(b"big") * 20)),
    "stranger_get": chunks((0, get(b"k")), (1, hello(1)[:20]), (1, get(b"k"))),
    "wrong_token": chunks((0, hello(0, b"x" * 21) + get(b"k"))),
    "replay": chunks((0, hello(0)), (1, hello(0) + get(b"k"))),
    "split_hello": chunks((0, hello(0)[:7]), (1, hello(1)[:40]), (0, hello(0)[7:50]), (1, hello(1)[40:]),
                          (0, hello(0)[50:] + set_(b"k", b"v")), (1, get(b"k"))),
}

if __name__ == "__main__":
    d = pathlib.Path(__file__).resolve().parent / "corpus" / "store_protocol"
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
        old.unlink()
    for name, data in CORPUS.items():
        (d / name).write_bytes(data)
    print(f"{len(CORPUS)} inputs in {d}")

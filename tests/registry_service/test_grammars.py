"""Tokenizers, compiled grammars and the Subscribe protocol's rules, over real gRPC."""

from __future__ import annotations

import queue

import grpc
import pytest

from tests.support.catalogs import mcp_bytes, tool
from tests.support.registry import RunningRegistry
from tests.support.waiting import wait_until
from tooltrie.client import error_details
from tooltrie.grammar import CompiledTrie, load_tokenizer
from tooltrie.grammar.tokenizers.blob import to_blob
from tooltrie.grammar.tokenizers.hf import HfTokenizer
from tooltrie.registry.v1 import registry_pb2 as pb
from tooltrie.registry.v1 import registry_pb2_grpc


@pytest.fixture(scope="module")
def qwen3_blob() -> pb.TokenizerBlob:
    blob = to_blob(load_tokenizer("qwen3"))
    return pb.TokenizerBlob(fingerprint=blob.fingerprint, kind=blob.kind, data=blob.data, name=blob.name)


def test_register_compile_and_compile_on_push(registry: RunningRegistry, qwen3_blob: pb.TokenizerBlob) -> None:
    with registry.client() as client:
        client.push("cat", mcp_bytes([tool("get_user"), tool("get_user_by_id"), tool("list_users")]), activate=True)
        assert client.register_tokenizer(qwen3_blob).created
        assert not client.register_tokenizer(qwen3_blob).created  # idempotent by fingerprint
        compiled = client.compile("cat", 0, qwen3_blob.fingerprint)
        assert compiled.version.number == 1 and compiled.result.ok
        stats = compiled.result.stats
        assert stats.root_out_degree >= 2 and stats.fits_constant_bank and stats.bytes > 0
        # Later pushes compile for every registered tokenizer, and report it.
        pushed = client.push("cat", mcp_bytes([tool("get_user"), tool("delete_user")]))
        (result,) = pushed.compiled
        assert result.ok and result.tokenizer_fingerprint == qwen3_blob.fingerprint and result.tokenizer_name == "qwen3"


def word_level_blob() -> pb.TokenizerBlob:
    """A real tokenizer that knows few words: distinct tool names collapse to the same [UNK] ids."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    backend = Backend(models.WordLevel({"[UNK]": 0, "ok": 1, "<|sep|>": 2, "<|im_end|>": 3}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<|sep|>", "<|im_end|>"])
    blob = to_blob(HfTokenizer(backend, name="word-level", sep_text="<|sep|>"))
    return pb.TokenizerBlob(fingerprint=blob.fingerprint, kind=blob.kind, data=blob.data, name=blob.name)


def test_compile_failure_keeps_the_version(registry: RunningRegistry, qwen3_blob: pb.TokenizerBlob) -> None:
    with registry.client() as client:
        client.register_tokenizer(qwen3_blob)
        client.register_tokenizer(word_level_blob())
        pushed = client.push("cat", mcp_bytes([tool("x.a"), tool("x.b")]), activate=True)
        results = {r.tokenizer_name: r for r in pushed.compiled}
        assert results["qwen3"].ok
        assert not results["word-level"].ok and "CompileError" in results["word-level"].error
        assert pushed.created and client.get("cat").version.number == 1  # the version is kept and active
        again = client.compile("cat", 1, results["word-level"].tokenizer_fingerprint)
        assert not again.result.ok and again.result.error == results["word-level"].error


def test_compile_errors(registry: RunningRegistry, qwen3_blob: pb.TokenizerBlob) -> None:
    with registry.client() as client:
        client.push("cat", mcp_bytes([tool("a")]))
        with pytest.raises(grpc.RpcError) as raised:
            client.compile("cat", 1, "f" * 64)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        forged = pb.TokenizerBlob(fingerprint="0" * 64, kind=qwen3_blob.kind, data=qwen3_blob.data, name="forged")
        with pytest.raises(grpc.RpcError) as raised:
            client.register_tokenizer(forged)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "fingerprint" in error_details(raised.value)[0].description
        client.register_tokenizer(qwen3_blob)
        with pytest.raises(grpc.RpcError) as raised:
            client.compile("nope", 1, qwen3_blob.fingerprint)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_both_modes_coexist_for_one_version(registry: RunningRegistry, qwen3_blob: pb.TokenizerBlob) -> None:
    with registry.client() as client:
        client.register_tokenizer(qwen3_blob)
        client.push("cat", mcp_bytes([tool("get_user"), tool("get_user_by_id"), tool("list_users")]))
        token = client.compile("cat", 1, qwen3_blob.fingerprint).result
        char = client.compile("cat", 1, qwen3_blob.fingerprint, char_mode=True).result
    assert token.ok and char.ok
    assert (token.mode, char.mode) == (pb.GRAMMAR_MODE_TOKEN, pb.GRAMMAR_MODE_CHAR)
    # Every tokenization of a name is legal in char mode: more edges leave the root than in the token trie.
    assert char.stats.root_out_degree > token.stats.root_out_degree


def test_subscribe_rules(registry: RunningRegistry, qwen3_blob: pb.TokenizerBlob) -> None:
    auth = [("authorization", f"Bearer {registry.tokens['alice']}")]
    with grpc.insecure_channel(registry.address) as channel:
        stub = registry_pb2_grpc.RegistryStub(channel)
        hello = pb.SubscribeRequest(hello=pb.DecoderHello(node_id="n1", tokenizer_fingerprint=qwen3_blob.fingerprint))
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Subscribe(iter([hello]), timeout=10))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ack_first = pb.SubscribeRequest(ack=pb.GrammarAck(nonce="x"))
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Subscribe(iter([ack_first]), metadata=auth, timeout=10))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_subscribe_protocol_by_hand(registry: RunningRegistry, qwen3_blob: pb.TokenizerBlob) -> None:
    """A decoder's conversation spelled out: hello, tokenizer upload on request, grammar, ACK."""
    outbox: queue.Queue[pb.SubscribeRequest | None] = queue.Queue()

    def requests():  # type: ignore[no-untyped-def]
        while (item := outbox.get()) is not None:
            yield item

    auth = [("authorization", f"Bearer {registry.tokens['bob']}")]
    with registry.client() as client:
        client.push("cat", mcp_bytes([tool("get_user"), tool("get_user_by_id")]), activate=True)
    with grpc.insecure_channel(registry.address) as channel:
        stream = registry_pb2_grpc.RegistryStub(channel).Subscribe(requests(), metadata=auth, timeout=60)
        outbox.put(
            pb.SubscribeRequest(hello=pb.DecoderHello(node_id="hand", tokenizer_fingerprint=qwen3_blob.fingerprint))
        )
        wanted = next(stream)
        assert wanted.tokenizer_wanted.fingerprint == qwen3_blob.fingerprint
        outbox.put(pb.SubscribeRequest(tokenizer=qwen3_blob))
        update = next(stream).grammar
        assert (update.catalog, update.version) == ("cat", 1)
        trie = CompiledTrie.from_bytes(update.trie, expected_fingerprint=qwen3_blob.fingerprint)
        assert sorted(trie.names) == ["get_user", "get_user_by_id"] == [t.name for t in update.tools]
        # A reply naming no pending update is ignored (it arrives first, so it is handled before the real ACK).
        forged = pb.GrammarNack(nonce="forged", catalog="cat", version=99, error="forged")
        outbox.put(pb.SubscribeRequest(nack=forged))
        outbox.put(pb.SubscribeRequest(ack=pb.GrammarAck(nonce=update.nonce, catalog="cat", version=1)))
        with registry.client() as client:
            wait_until(lambda: [d.applied_version for d in client.status("cat").decoders] == [1], "the ACK")
            (status,) = client.status("cat").decoders
            assert status.node_id == "hand" and status.connected and status.applied_version == 1
            assert status.nacked_version == 0 and not status.nack_error
            # An activation reaches the subscriber without it asking.
            client.push("cat", mcp_bytes([tool("get_user")]), activate=True)
        update = next(stream).grammar
        assert (update.catalog, update.version, [t.name for t in update.tools]) == ("cat", 2, ["get_user"])
        outbox.put(None)
        stream.cancel()

"""Prometheus metrics of one decoder (its own registry, so several decoders can share a process in tests)."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class DecoderMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tooltrie_decoder_requests", "Decode calls by final status code", ["code"], registry=r)
        self.pointers = Counter("tooltrie_decoder_pointers", "Pointers streamed", registry=r)
        self.tokens = Counter("tooltrie_decoder_tokens", "Tokens decoded (rate() gives tokens per second)", registry=r)
        self.first_pointer = Histogram(
            "tooltrie_decoder_first_pointer_seconds", "Admission to first pointer", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.answer = Histogram(
            "tooltrie_decoder_answer_seconds", "Admission to the summary", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.grammar_version = Gauge(
            "tooltrie_decoder_grammar_version", "Active catalog version", ["catalog"], registry=r
        )
        self.swaps = Counter("tooltrie_decoder_grammar_swaps", "Grammar versions activated", registry=r)
        self.nacks = Counter("tooltrie_decoder_grammar_nacks", "Grammar updates refused", registry=r)

    def serve(self, address: str) -> WSGIServer:
        """Serves /metrics over HTTP on HOST:PORT (port 0 picks one: see the returned server's server_port)."""
        host, _, port = address.rpartition(":")
        server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        return server

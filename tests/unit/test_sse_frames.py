"""SSE frames as OpenAI and vLLM send them: `data: ...` lines, each event ended by a blank line
of bare "\n". Clients that split the stream on "\n\n" (vllm.benchmarks.serve, the peers
benchmark's load generator) cannot parse "\r\n" frames once two events share one read."""

from deployments.request_path import sse


def test_data_frame_ends_with_blank_line_of_bare_newlines():
    assert sse({"choices": []}).encode() == b'data: {"choices":[]}\n\n'
    assert sse("[DONE]").encode() == b"data: [DONE]\n\n"


def test_error_event_frame():
    assert sse({"error": {"code": "x"}}, event="error").encode() == (
        b'event: error\ndata: {"error":{"code":"x"}}\n\n'
    )


def test_two_frames_split_on_blank_lines():
    stream = (sse({"a": 1}).encode() + sse("[DONE]").encode()).decode()
    assert stream.split("\n\n")[:2] == ['data: {"a":1}', "data: [DONE]"]

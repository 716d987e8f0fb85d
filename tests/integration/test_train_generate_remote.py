"""`train generate --url` drives a running server over the OpenAI API and resumes by id."""

import json

from tests.integration.conftest import Server, plain_args


def test_generate_against_a_running_server_resumes(models, log_dir, tmp_path):
    from sglang_dspark.train.__main__ import main

    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"turns": [f"count to {i}"]}) + "\n" for i in range(5)))
    out = tmp_path / "gen.jsonl"
    with Server("generate_remote", plain_args(models.tiny), None, log_dir) as srv:
        args = ["generate", "--url", srv.url, "--sources", str(src), "--out", str(out), "--max-new-tokens", "6",
                "--temperature", "0", "--batch", "2"]
        main([*args, "--limit", "3"])
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert [r["id"] for r in rows] == ["prompts-0", "prompts-1", "prompts-2"]
        assert all(r["messages"][0] == {"role": "user", "content": f"count to {i}"} for i, r in enumerate(rows))
        assert all(r["messages"][1]["role"] == "assistant" and r["messages"][1]["content"] for r in rows)
        main(args)  # resumes: only the two prompts not answered yet
        rows2 = [json.loads(x) for x in out.read_text().splitlines()]
        assert [r["id"] for r in rows2] == [f"prompts-{i}" for i in range(5)] and rows2[:3] == rows

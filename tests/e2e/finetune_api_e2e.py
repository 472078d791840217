#!/usr/bin/env python3
"""OpenAI's files + fine-tuning API against the real `chorus serve` (docs/api.md, "Files and
fine-tuning"): upload a JSONL made from the stories260K "things" text, train through
/v1/fine_tuning/jobs, watch events and checkpoints, serve the ft: model at once; cancel; bad
input (4xx naming the problem for a bad request; for bad data a job created as
validating_files that turns failed naming the line) while the server keeps serving; the status
sequence validating_files -> queued -> running -> succeeded (statuses polled, and the events);
and a restart in the middle of a job, which resumes from its checkpoint and succeeds.

Usage: finetune_api_e2e.py CHORUS_BINARY MODELS_DIR
Exits 77 (skip) when the models are absent, unless CHORUS_REQUIRE_MODELS=1.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

BASE = "stories260K"


def skip(why):
    print("finetune_api_e2e: " + why, file=sys.stderr)
    sys.exit(1 if os.environ.get("CHORUS_REQUIRE_MODELS") == "1" else 77)


class Server:
    def __init__(self, chorus, models, state, extra=()):
        args = [chorus, "serve", "--model", os.path.join(models, "stories260K/stories260K.bin"),
                "--tokenizer", os.path.join(models, "stories260K/tok512.bin"),
                "--served-model-name", BASE, "--port", "0", "--threads", "1",
                "--pool-size", "64", "--registry", os.path.join(state, "registry.json"),
                "--finetune-dir", os.path.join(state, "ft"), "--max-body-bytes", str(1 << 20),
                *extra]
        self.log = open(os.path.join(state, "server.log"), "a")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        deadline = time.time() + 60
        self.url = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"at (http://\S+)/v1", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            self.proc.kill()
            raise RuntimeError("server did not start; see " + self.log.name)

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.log.close()
        return code

    def request(self, method, path, body=None, headers=None):
        data = None
        headers = dict(headers or {})
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif body is not None:
            data = body
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw = e.read()
            status = e.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def upload(self, content, filename="train.jsonl", purpose="fine-tune"):
        boundary = uuid.uuid4().hex
        parts = []
        if purpose is not None:
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
                         f'{purpose}\r\n'.encode())
        if content is not None:
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                         f'filename="{filename}"\r\nContent-Type: application/jsonl\r\n\r\n'
                         .encode() + content + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return self.request("POST", "/v1/files", body,
                            {"Content-Type": "multipart/form-data; boundary=" + boundary})

    def wait_job(self, job_id, pred, timeout=300, seen=None):
        """Polls the job until pred(job); `seen` (a list) collects each status change observed."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, job = self.request("GET", "/v1/fine_tuning/jobs/" + job_id)
            assert status == 200, job
            if seen is not None and (not seen or seen[-1] != job["status"]):
                seen.append(job["status"])
            if pred(job):
                return job
            time.sleep(0.02)
        raise AssertionError(f"job {job_id} did not get there: {job}")

    def event_messages(self, job_id):
        """The job's event messages, oldest first."""
        code, ev = self.request("GET", f"/v1/fine_tuning/jobs/{job_id}/events?limit=1000")
        assert code == 200, ev
        return [e["message"] for e in reversed(ev["data"])]

    def complete(self, model):
        return self.request("POST", "/v1/completions",
                            {"model": model, "prompt": "They went to the", "max_tokens": 8,
                             "temperature": 0})


def things_jsonl(models):
    """The "things" training text as JSONL: each blank-line separated document a {"text"}."""
    text = open(os.path.join(models, "stories260K-finetunes/things/data/train.txt"),
                encoding="utf-8").read()
    docs = [d.strip("\n") for d in re.split(r"\n[ \t]*\n", text) if d.strip()]
    return b"".join(json.dumps({"text": d}).encode() + b"\n" for d in docs)


def expect_error(got, status, *words):
    code, body = got
    assert code == status, (code, body)
    msg = body["error"]["message"]
    for w in words:
        assert w in msg, (w, msg)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    chorus, models = sys.argv[1], sys.argv[2]
    if not os.path.exists(os.path.join(models, "stories260K/stories260K.bin")):
        skip(models + "/stories260K/stories260K.bin not found")
    if not os.path.exists(os.path.join(models, "stories260K-finetunes/things/data/train.txt")):
        skip("the stories260K 'things' data is not found")
    state = tempfile.mkdtemp(prefix="chorus-ft-e2e-")
    data = things_jsonl(models)
    small = b"".join(data.splitlines(keepends=True)[:24])
    passed = 0

    def ok(name):
        nonlocal passed
        passed += 1
        print("ok   " + name, flush=True)

    srv = Server(chorus, models, state)
    try:
        # Files.
        code, f = srv.upload(small, "small.jsonl")
        assert code == 200, f
        assert f["object"] == "file" and f["purpose"] == "fine-tune" and f["id"].startswith("file-")
        assert f["bytes"] == len(small) and f["filename"] == "small.jsonl"
        small_id = f["id"]
        code, lst = srv.request("GET", "/v1/files")
        assert code == 200 and lst["object"] == "list" and lst["has_more"] is False
        assert [x["id"] for x in lst["data"]] == [small_id]
        assert srv.request("GET", "/v1/files/" + small_id)[1]["bytes"] == len(small)
        assert srv.request("GET", f"/v1/files/{small_id}/content")[1] == small
        code, big = srv.upload(data, "things.jsonl")
        assert code == 200, big
        code, page = srv.request("GET", "/v1/files?limit=1")
        assert code == 200 and page["has_more"] is True and page["data"][0]["id"] == big["id"]
        ok("files: upload, list (newest first, limit/has_more), retrieve, content")

        expect_error(srv.upload(small, purpose=None), 400, "purpose")
        expect_error(srv.upload(small, purpose="assistants"), 400, "fine-tune")
        expect_error(srv.upload(None), 400, "file")
        code, _ = srv.upload(b"x" * ((1 << 20) + 10))
        assert code == 413, code
        expect_error(srv.request("GET", "/v1/files/file-nope"), 404, "file-nope")
        expect_error(srv.request("DELETE", "/v1/files/file-nope"), 404, "file-nope")
        ok("files: missing purpose, wrong purpose, no file, too large (413), unknown id")

        # Bad job requests: 4xx naming the problem.
        def create(**kw):
            body = {"model": BASE, "training_file": small_id}
            body.update(kw)
            return srv.request("POST", "/v1/fine_tuning/jobs", body)
        expect_error(create(model="gpt-4o-mini"), 400, "gpt-4o-mini")
        expect_error(create(training_file="file-missing"), 400, "file-missing")
        expect_error(create(validation_file="file-missing2"), 400, "file-missing2")
        expect_error(create(hyperparameters={"n_epochs": 0}), 400, "n_epochs")
        expect_error(create(hyperparameters={"batch_size": 100000}), 400, "batch_size")
        expect_error(create(hyperparameters={"learning_rate_multiplier": -1}), 400,
                     "learning_rate_multiplier")
        expect_error(create(hyperparameters={"lora_rank": 0}), 400, "lora_rank")
        expect_error(create(hyperparameters={"lora_targets": ["q", "nope"]}), 400, "nope")
        expect_error(create(hyperparameters={"seq_len": 100000}), 400, "seq_len")
        expect_error(create(hyperparameters={"epochs": 2}), 400, "epochs")
        expect_error(create(suffix="bad suffix!"), 400, "suffix")
        expect_error(srv.request("POST", "/v1/fine_tuning/jobs", b"{not json",
                                 {"Content-Type": "application/json"}), 400, "JSON")
        expect_error(srv.request("GET", "/v1/fine_tuning/jobs/ftjob-nope"), 404, "ftjob-nope")
        ok("jobs: unknown base model, unknown files, hyperparameters out of range, bad suffix")

        # Bad data: the request is accepted (the files are validated after the answer, as in
        # OpenAI's API), then the job fails naming the line, never queued; nothing registered.
        bad = small.splitlines(keepends=True)
        bad.insert(2, b'{"text": "unterminated\n')
        code, bf = srv.upload(b"".join(bad), "bad.jsonl")
        assert code == 200
        code, job = create(training_file=bf["id"], suffix="bad")
        assert code == 200, job
        assert job["status"] == "validating_files" and job["error"] is None, job
        seen = [job["status"]]
        job = srv.wait_job(job["id"], lambda j: j["status"] not in ("validating_files",), seen=seen)
        assert seen == ["validating_files", "failed"], seen
        assert job["status"] == "failed", job
        assert job["error"]["code"] == "invalid_training_file", job["error"]
        assert job["error"]["param"] == "training_file", job["error"]
        assert "line 3" in job["error"]["message"] and bf["id"] in job["error"]["message"], job
        assert job["fine_tuned_model"] is None and job["finished_at"] is not None, job
        msgs = srv.event_messages(job["id"])
        assert msgs[0].startswith("Validating training file") and \
            msgs[-1].startswith("Validation failed") and "line 3" in msgs[-1], msgs
        assert not any("queued" in m or "started" in m for m in msgs), msgs
        code, c = srv.complete(BASE)
        assert code == 200, c
        ok("jobs: bad data is accepted as validating_files, then failed naming line 3 (never "
           "queued); server keeps serving")

        # A job that succeeds; the server serves while it trains.
        code, job = create(suffix="small", seed=7,
                           hyperparameters={"n_epochs": 2, "batch_size": 2, "lora_rank": 4,
                                            "lora_targets": "q,v", "checkpoint_every": 3})
        assert code == 200, job
        assert job["object"] == "fine_tuning.job" and job["id"].startswith("ftjob-")
        assert job["status"] == "validating_files", job
        assert job["hyperparameters"] == {"n_epochs": 2, "batch_size": 2,
                                          "learning_rate_multiplier": 1.0}, job
        assert job["seed"] == 7 and job["training_file"] == small_id
        code, c = srv.complete(BASE)
        assert code == 200, c
        seen = [job["status"]]
        job = srv.wait_job(job["id"], lambda j: j["status"] in ("succeeded", "failed", "cancelled"),
                           seen=seen)
        assert job["status"] == "succeeded", job
        # Polling may miss a short-lived status, never reorder them.
        order = ["validating_files", "queued", "running", "succeeded"]
        assert all(s in order for s in seen) and seen == sorted(seen, key=order.index), seen
        msgs = srv.event_messages(job["id"])
        marks = [next(i for i, m in enumerate(msgs) if m.startswith(p)) for p in
                 ("Validating training file", "Files validated", "Fine-tuning job started",
                  "Step 1/", "The job has successfully completed")]
        assert marks == sorted(marks), msgs
        name = job["fine_tuned_model"]
        assert name == f"ft:{BASE}:small:{job['id']}", name
        assert job["trained_tokens"] > 0 and job["finished_at"] >= job["created_at"]
        code, ev = srv.request("GET", f"/v1/fine_tuning/jobs/{job['id']}/events?limit=1000")
        assert code == 200 and ev["object"] == "list", ev
        msgs = [e["message"] for e in ev["data"]]
        assert ev["data"][0]["object"] == "fine_tuning.job.event"
        assert msgs[0] == "The job has successfully completed", msgs[:3]
        assert any(m.startswith("Step 1/") for m in msgs), msgs
        code, ev2 = srv.request("GET", f"/v1/fine_tuning/jobs/{job['id']}/events?limit=2")
        assert len(ev2["data"]) == 2 and ev2["has_more"] is True
        code, ev3 = srv.request(
            "GET", f"/v1/fine_tuning/jobs/{job['id']}/events?limit=2&after={ev2['data'][1]['id']}")
        assert ev3["data"][0]["id"] == ev["data"][2]["id"], (ev3, ev["data"][:3])
        code, ck = srv.request("GET", f"/v1/fine_tuning/jobs/{job['id']}/checkpoints")
        assert code == 200 and ck["data"], ck
        assert ck["data"][0]["object"] == "fine_tuning.job.checkpoint"
        assert ck["data"][0]["fine_tuning_job_id"] == job["id"]
        steps = [c["step_number"] for c in ck["data"]]
        assert steps == sorted(steps, reverse=True) and steps[0] == job["chorus"]["total_steps"]
        code, metrics = srv.request("GET", "/metrics")
        it = re.search(rb"^chorus_finetune_iterations_total (\d+)$", metrics, re.M)
        assert it and int(it.group(1)) >= job["chorus"]["total_steps"], metrics[-600:]
        code, models_list = srv.request("GET", "/v1/models")
        assert name in [m["id"] for m in models_list["data"]], models_list
        code, c = srv.complete(name)
        assert code == 200 and c["model"] == name and c["choices"][0]["text"], c
        code, jobs = srv.request("GET", "/v1/fine_tuning/jobs?limit=1")
        assert code == 200 and jobs["data"][0]["id"] == job["id"] and jobs["has_more"] is True
        ok("jobs: succeeds, events (newest first, paginated), checkpoints, ft: model listed "
           "and answering at once")
        done_id, done_name = job["id"], name

        # A file used by a live job cannot be deleted; cancel.
        code, job = create(suffix="cancel", hyperparameters={"n_steps": 100000})
        assert code == 200 and job["status"] == "validating_files", job
        code, err = srv.request("DELETE", "/v1/files/" + small_id)
        assert code == 409 and job["id"] in err["error"]["message"], err
        srv.wait_job(job["id"], lambda j: j["chorus"].get("step", 0) >= 1)
        # A job created while another runs: validating_files, then queued behind it (both
        # observed), cancelled at once while queued.
        code, waiting = create(suffix="waits")
        assert code == 200 and waiting["status"] == "validating_files", waiting
        seen = [waiting["status"]]
        srv.wait_job(waiting["id"], lambda j: j["status"] != "validating_files", seen=seen)
        assert seen == ["validating_files", "queued"], seen
        code, wj = srv.request("POST", f"/v1/fine_tuning/jobs/{waiting['id']}/cancel")
        assert code == 200 and wj["status"] == "cancelled", wj
        code, cj = srv.request("POST", f"/v1/fine_tuning/jobs/{job['id']}/cancel")
        assert code == 200, cj
        cj = srv.wait_job(job["id"], lambda j: j["status"] != "running")
        assert cj["status"] == "cancelled" and cj["fine_tuned_model"] is None, cj
        ids = [m["id"] for m in srv.request("GET", "/v1/models")[1]["data"]]
        assert not any(":cancel:" in i for i in ids), ids
        ok("jobs: cancel a running job; nothing registered; its file stays while it runs; a job "
           "created meanwhile goes validating_files -> queued and cancels at once")

        # Restart in the middle of a job: it resumes from its latest checkpoint and succeeds.
        code, job = create(suffix="resume", seed=3,
                           hyperparameters={"n_steps": 40, "batch_size": 2, "lora_rank": 4,
                                            "checkpoint_every": 5})
        assert code == 200, job
        resume_id = job["id"]
        srv.wait_job(resume_id, lambda j: len(
            srv.request("GET", f"/v1/fine_tuning/jobs/{resume_id}/checkpoints")[1]["data"]) >= 2
            and j["status"] == "running")
        assert srv.stop() == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    srv = Server(chorus, models, state)
    try:
        # Files, finished jobs and registered adapters survive.
        code, lst = srv.request("GET", "/v1/files")
        assert small_id in [x["id"] for x in lst["data"]], lst
        code, j = srv.request("GET", "/v1/fine_tuning/jobs/" + done_id)
        assert j["status"] == "succeeded" and j["fine_tuned_model"] == done_name, j
        assert srv.complete(done_name)[0] == 200
        job = srv.wait_job(resume_id, lambda j: j["status"] in ("succeeded", "failed",
                                                                 "cancelled"))
        assert job["status"] == "succeeded", job
        code, ev = srv.request("GET", f"/v1/fine_tuning/jobs/{resume_id}/events?limit=1000")
        msgs = [e["message"] for e in ev["data"]]
        assert "Fine-tuning job resumed" in msgs, msgs
        assert any(m.startswith("Interrupted by shutdown") for m in msgs), msgs
        # It went on from its checkpoint: fewer steps after the restart than in the job.
        after = msgs[:msgs.index("Fine-tuning job resumed")]
        steps_after = [m for m in after if m.startswith("Step ")]
        assert 0 < len(steps_after) < 40, len(steps_after)
        assert srv.complete(job["fine_tuned_model"])[0] == 200
        # The finished job's files can go now.
        code, d = srv.request("DELETE", "/v1/files/" + small_id)
        assert code == 200 and d == {"id": small_id, "object": "file", "deleted": True}, d
        ok("restart: files, jobs and adapters survive; a running job resumes from its "
           "checkpoint and succeeds")
        assert srv.stop() == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    print(f"{passed} passed, 0 failed")
    shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

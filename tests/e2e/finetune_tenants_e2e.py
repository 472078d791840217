#!/usr/bin/env python3
"""Per-tenant ownership of fine-tuning files, jobs and their adapters against the real
`chorus serve --tenants` (docs/api.md, "Tenants" and "Files and fine-tuning").

The matrix: tenant x route x ownership. Each files and jobs route answers 200 for the caller's
own record and 404 for another tenant's, with the very error of an unknown id (no leak); lists
show only the caller's records and pagination (`after`, `limit`, `has_more`) counts only those;
a job naming another tenant's training or validation file gets the error of an unknown file.
Records made by a server without tenants (the start of this test) are shared: every tenant
sees and uses them, none may delete or cancel them (403). A job's `ft:` adapter belongs to the
job's tenant like one it loaded itself (not in the others' /v1/models, 404 when they use, look
up or unload it; `ft:` names cannot be loaded through the API). A restart keeps every owner, and
a job interrupted by it resumes and registers its adapter for its tenant. Started without
--tenants again, the server shows only the shared records.

Usage: finetune_tenants_e2e.py CHORUS_BINARY MODELS_DIR
Exits 77 (skip) when the models are absent, unless CHORUS_REQUIRE_MODELS=1.
"""
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from finetune_api_e2e import BASE, Server, skip, things_jsonl  # noqa: E402

TENANTS = {"tenants": {"acme": {"keys": ["sk-acme-0001"]},
                       "blue": {"keys": ["sk-blue-0001", "sk-blue-0002"]}}}
ACME, BLUE = "sk-acme-0001", "sk-blue-0002"
UNKNOWN_FILE = "file-000000ff0000000000000001"
UNKNOWN_JOB = "ftjob-00000000000000000000ff"


class As:
    """Requests to `srv` with one tenant's key (None: no key)."""

    def __init__(self, srv, key):
        self.srv, self.key = srv, key

    def request(self, method, path, body=None, headers=None):
        headers = dict(headers or {})
        if self.key:
            headers["Authorization"] = "Bearer " + self.key
        return self.srv.request(method, path, body, headers)

    def get(self, path):
        return self.request("GET", path)

    def upload(self, content, filename):
        boundary = uuid.uuid4().hex
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
                f'fine-tune\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                f'filename="{filename}"\r\nContent-Type: application/jsonl\r\n\r\n').encode()
        body += content + f"\r\n--{boundary}--\r\n".encode()
        code, f = self.request("POST", "/v1/files", body,
                               {"Content-Type": "multipart/form-data; boundary=" + boundary})
        assert code == 200, (code, f)
        return f["id"]

    def create(self, training_file, **kw):
        body = {"model": BASE, "training_file": training_file}
        body.update(kw)
        return self.request("POST", "/v1/fine_tuning/jobs", body)

    def wait_job(self, job_id, pred, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            code, job = self.get("/v1/fine_tuning/jobs/" + job_id)
            assert code == 200, (code, job)
            if pred(job):
                return job
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} did not get there: {job}")

    def finished(self, job_id):
        job = self.wait_job(job_id, lambda j: j["status"] in ("succeeded", "failed", "cancelled"))
        assert job["status"] == "succeeded", job
        return job

    def ids(self, path):
        code, lst = self.get(path)
        assert code == 200 and lst["object"] == "list", (code, lst)
        return [x["id"] for x in lst["data"]], lst["has_more"]

    def models(self):
        code, lst = self.get("/v1/models")
        assert code == 200, lst
        return [m["id"] for m in lst["data"]]

    def complete(self, model):
        return self.request("POST", "/v1/completions",
                            {"model": model, "prompt": "They went to the", "max_tokens": 4,
                             "temperature": 0})


def same_as_unknown(got, unknown, their_id, unknown_id):
    """Another tenant's id got exactly the answer of an unknown id (the id aside)."""
    (code, body), (ucode, ubody) = got, unknown
    assert code == ucode and code in (400, 404), (code, body, ucode, ubody)
    e, u = body["error"], ubody["error"]
    assert {k: v for k, v in e.items() if k != "message"} == \
        {k: v for k, v in u.items() if k != "message"}, (e, u)
    assert e["message"].replace(their_id, "ID") == u["message"].replace(unknown_id, "ID"), (e, u)


def file_routes(fid):
    return [("GET", f"/v1/files/{fid}"), ("GET", f"/v1/files/{fid}/content"),
            ("DELETE", f"/v1/files/{fid}")]


def job_routes(jid):
    return [("GET", f"/v1/fine_tuning/jobs/{jid}"), ("GET", f"/v1/fine_tuning/jobs/{jid}/events"),
            ("GET", f"/v1/fine_tuning/jobs/{jid}/checkpoints"),
            ("POST", f"/v1/fine_tuning/jobs/{jid}/cancel")]


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    chorus, models = sys.argv[1], sys.argv[2]
    if not os.path.exists(os.path.join(models, "stories260K/stories260K.bin")):
        skip(models + "/stories260K/stories260K.bin not found")
    if not os.path.exists(os.path.join(models, "stories260K-finetunes/things/data/train.txt")):
        skip("the stories260K 'things' data is not found")
    state = tempfile.mkdtemp(prefix="chorus-ft-tenants-e2e-")
    tenants_file = os.path.join(state, "tenants.json")
    with open(tenants_file, "w") as f:
        json.dump(TENANTS, f)
    with_tenants = ["--tenants", tenants_file]
    small = b"".join(things_jsonl(models).splitlines(keepends=True)[:24])
    quick = {"n_steps": 2, "batch_size": 2, "lora_rank": 4, "checkpoint_every": 1}
    passed = 0

    def ok(name):
        nonlocal passed
        passed += 1
        print("ok   " + name, flush=True)

    def run(extra, body):
        srv = Server(chorus, models, state, extra)
        try:
            body(srv)
            assert srv.stop() == 0
        finally:
            if srv.proc.poll() is None:
                srv.proc.kill()

    ctx = {}

    # 1. A server without tenants: its file, job and ft: adapter have no owner.
    def without_tenants(srv):
        anyone = As(srv, None)
        ctx["legacy_file"] = anyone.upload(small, "legacy.jsonl")
        code, job = anyone.create(ctx["legacy_file"], suffix="legacy", hyperparameters=quick)
        assert code == 200, job
        ctx["legacy_job"] = job["id"]
        ctx["legacy_model"] = anyone.finished(job["id"])["fine_tuned_model"]
        ok("without tenants: a file, a job and its ft: adapter (ownerless)")
    run([], without_tenants)

    # 2. The same state under --tenants.
    def tenants(srv):
        acme, blue = As(srv, ACME), As(srv, BLUE)
        legacy_file, legacy_job, legacy_model = (ctx["legacy_file"], ctx["legacy_job"],
                                                 ctx["legacy_model"])
        for who in (As(srv, None), As(srv, "sk-nobody-0001")):
            assert who.get("/v1/files")[0] == 401
            assert who.get("/v1/fine_tuning/jobs")[0] == 401
        a1 = acme.upload(small, "a1.jsonl")
        b1 = blue.upload(small, "b1.jsonl")
        a2 = acme.upload(small, "a2.jsonl")
        # Lists: own (newest first) and the shared file, never the other tenant's.
        assert acme.ids("/v1/files") == ([a2, a1, legacy_file], False)
        assert blue.ids("/v1/files") == ([b1, legacy_file], False)
        assert acme.ids("/v1/files?purpose=fine-tune&limit=1") == ([a2], True)
        assert acme.ids(f"/v1/files?limit=1&after={a2}") == ([a1], True)
        assert acme.ids(f"/v1/files?limit=1&after={a1}") == ([legacy_file], False)
        assert blue.ids("/v1/files?limit=1") == ([b1], True)
        assert blue.ids(f"/v1/files?limit=1&after={b1}") == ([legacy_file], False)
        code, lst = blue.get("/v1/files?limit=2")
        assert lst["first_id"] == b1 and lst["last_id"] == legacy_file, lst
        # `after` naming another tenant's file: the answer to an unknown id.
        same_as_unknown(blue.get(f"/v1/files?after={a1}"),
                        blue.get(f"/v1/files?after={UNKNOWN_FILE}"), a1, UNKNOWN_FILE)
        ok("files: lists show own + shared only; limit/after/has_more over what the tenant sees")

        # Route matrix: own → 200, other's → the unknown id's 404, shared → read 200 / delete 403.
        for owner, other, fid in ((acme, blue, a2), (blue, acme, b1)):
            for method, path in file_routes(fid):
                same_as_unknown(other.request(method, path),
                                other.request(method, path.replace(fid, UNKNOWN_FILE)),
                                fid, UNKNOWN_FILE)
            for method, path in file_routes(fid):
                code, body = owner.request(method, path)
                assert code == 200, (method, path, code, body)
        assert acme.get(f"/v1/files/{b1}")[0] == 404, "deleted by its owner above"
        for who in (acme, blue):
            code, f = who.get(f"/v1/files/{legacy_file}")
            assert code == 200 and f["id"] == legacy_file, f
            assert who.get(f"/v1/files/{legacy_file}/content") == (200, small)
            code, err = who.request("DELETE", f"/v1/files/{legacy_file}")
            assert code == 403 and err["error"]["type"] == "permission_error", (code, err)
        ok("files: get/content/delete own 200, other's 404 as unknown, shared readable, 403 to "
           "delete")

        # Jobs: another tenant's file is an unknown file; the shared file may be used.
        for field in ("training_file", "validation_file"):
            kw = {"suffix": "x", "hyperparameters": quick}
            base = {} if field == "training_file" else {"validation_file": a1}
            unk = {} if field == "training_file" else {"validation_file": UNKNOWN_FILE}
            got = blue.create(a1 if field == "training_file" else legacy_file, **base, **kw)
            want = blue.create(UNKNOWN_FILE if field == "training_file" else legacy_file,
                               **unk, **kw)
            same_as_unknown(got, want, a1, UNKNOWN_FILE)
            assert got[1]["error"]["code"] == "invalid_" + field, got
        assert blue.ids("/v1/fine_tuning/jobs") == ([legacy_job], False), "nothing was created"
        code, ja = acme.create(a1, suffix="acme", seed=1, hyperparameters=quick)
        assert code == 200, ja
        ja = acme.finished(ja["id"])["id"]
        code, jb = blue.create(legacy_file, suffix="blue",
                               hyperparameters={"n_steps": 100000, "batch_size": 2,
                                                "lora_rank": 4})
        assert code == 200 and jb["status"] == "validating_files", jb  # answered before validation
        jb = jb["id"]
        ok("jobs: another tenant's training/validation file is refused as unknown; the shared "
           "file can be used")

        assert acme.ids("/v1/fine_tuning/jobs") == ([ja, legacy_job], False)
        assert blue.ids("/v1/fine_tuning/jobs") == ([jb, legacy_job], False)
        assert acme.ids("/v1/fine_tuning/jobs?limit=1") == ([ja], True)
        assert acme.ids(f"/v1/fine_tuning/jobs?limit=1&after={ja}") == ([legacy_job], False)
        same_as_unknown(blue.get(f"/v1/fine_tuning/jobs?after={ja}"),
                        blue.get(f"/v1/fine_tuning/jobs?after={UNKNOWN_JOB}"), ja, UNKNOWN_JOB)
        # Route matrix (cancel last: it ends blue's job).
        for owner, other, jid in ((acme, blue, ja), (blue, acme, jb)):
            for method, path in job_routes(jid):
                same_as_unknown(other.request(method, path),
                                other.request(method, path.replace(jid, UNKNOWN_JOB)),
                                jid, UNKNOWN_JOB)
            for method, path in job_routes(jid):
                code, body = owner.request(method, path)
                assert code == 200, (method, path, code, body)
        assert blue.wait_job(jb, lambda j: j["status"] != "running")["status"] == "cancelled"
        for who in (acme, blue):
            for method, path in job_routes(legacy_job)[:3]:
                assert who.request(method, path)[0] == 200, (method, path)
            code, err = who.request("POST", f"/v1/fine_tuning/jobs/{legacy_job}/cancel")
            assert code == 403 and err["error"]["type"] == "permission_error", (code, err)
        code, job = acme.get(f"/v1/fine_tuning/jobs/{ja}")
        ctx["acme_model"] = job["fine_tuned_model"]
        ok("jobs: list own + shared, paginated; get/events/checkpoints/cancel own 200, other's "
           "404 as unknown; shared readable, 403 to cancel")

        # The ft: adapters: acme's is acme's; the ownerless job's is shared.
        acme_model = ctx["acme_model"]
        assert acme_model in acme.models() and legacy_model in acme.models()
        assert acme_model not in blue.models() and legacy_model in blue.models()
        assert acme.complete(acme_model)[0] == 200
        same_as_unknown(blue.complete(acme_model), blue.complete("ft:nope"), acme_model,
                        "ft:nope")
        assert acme.get("/v1/models/" + acme_model)[0] == 200
        assert blue.get("/v1/models/" + acme_model)[0] == 404
        for who in (acme, blue):
            assert who.complete(legacy_model)[0] == 200
        code, err = blue.request("POST", "/v1/unload_lora_adapter", {"lora_name": acme_model})
        assert code == 404, (code, err)
        code, err = blue.request("POST", "/v1/load_lora_adapter",
                                 {"lora_name": "ft:" + BASE + ":x:ftjob-1",
                                  "lora_path": "/nonexistent"})
        assert code == 400 and "reserved" in err["error"]["message"], (code, err)
        assert acme.complete(acme_model)[0] == 200
        ok("ft: adapters: the job tenant's only (models, completions, lookup, unload); the "
           "ownerless job's shared; ft: names reserved")

        # A job that a restart interrupts.
        code, jr = acme.create(a1, suffix="resume", seed=3,
                               hyperparameters={"n_steps": 40, "batch_size": 2, "lora_rank": 4,
                                                "checkpoint_every": 5})
        assert code == 200, jr
        ctx["resume"] = jr["id"]
        ctx["a1"], ctx["ja"] = a1, ja
        acme.wait_job(jr["id"], lambda j: len(acme.get(
            f"/v1/fine_tuning/jobs/{jr['id']}/checkpoints")[1]["data"]) >= 2
            and j["status"] == "running")
    run(with_tenants, tenants)

    # 3. A restart: owners persisted; the interrupted job resumes and registers for acme.
    def restarted(srv):
        acme, blue = As(srv, ACME), As(srv, BLUE)
        a1, ja, jr = ctx["a1"], ctx["ja"], ctx["resume"]
        assert acme.ids("/v1/files") == ([a1, ctx["legacy_file"]], False)
        assert blue.ids("/v1/files") == ([ctx["legacy_file"]], False)
        assert blue.get(f"/v1/files/{a1}")[0] == 404
        assert blue.get(f"/v1/fine_tuning/jobs/{ja}")[0] == 404
        assert blue.get(f"/v1/fine_tuning/jobs/{jr}/events")[0] == 404
        job = acme.finished(jr)
        _, ev = acme.get(f"/v1/fine_tuning/jobs/{jr}/events?limit=1000")
        assert "Fine-tuning job resumed" in [e["message"] for e in ev["data"]], ev
        resumed_model = job["fine_tuned_model"]
        for name in (ctx["acme_model"], resumed_model):
            assert name in acme.models() and name not in blue.models(), name
            assert acme.complete(name)[0] == 200
            assert blue.complete(name)[0] == 404
        assert ctx["legacy_model"] in blue.models()
        ctx["resumed_model"] = resumed_model
        ok("restart: files, jobs and ft: adapters keep their owners; the resumed job's adapter "
           "is its tenant's")
    run(with_tenants, restarted)

    # 4. Without --tenants again: only the ownerless records (the adapters' rule).
    def tenants_off(srv):
        anyone = As(srv, None)
        assert anyone.ids("/v1/files") == ([ctx["legacy_file"]], False)
        assert anyone.ids("/v1/fine_tuning/jobs") == ([ctx["legacy_job"]], False)
        assert anyone.get(f"/v1/files/{ctx['a1']}")[0] == 404
        names = anyone.models()
        assert ctx["legacy_model"] in names and ctx["acme_model"] not in names, names
        ok("without tenants again: the owned records and adapters are not shown")
    run([], tenants_off)

    print(f"{passed} passed, 0 failed")
    shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hostile API inputs and storage faults: integers too long to read get a 422 naming the
field (not a bare 500); a submit on a full data directory gets a 507 naming it, and
nothing stored is lost."""

from __future__ import annotations

from tests.service.store_faults import FlakyWrites

SPEC = {"name": "digits", "command": ["python", "train.py"], "working_dir": "/tmp",
        "max_replicas": 2}


def _post(client, path: str, text: str):  # type: ignore[no-untyped-def]
    return client.post(path, content=text, headers={"Content-Type": "application/json"})


def test_an_integer_too_long_to_read_is_a_422_naming_the_field(client):
    digits = "9" * 5000
    response = _post(client, "/api/jobs", '{"name": "a", "command": ["x"], '
                                          f'"working_dir": "/tmp", "max_replicas": {digits}}}')
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "max_replicas"
    assert "5000 digits" in response.json()["detail"]
    nested = _post(client, "/api/jobs", '{"name": "a", "command": ["x"], '
                                        f'"resources": {{"gpu": -{digits}}}}}')
    assert nested.status_code == 422 and nested.json()["field"] == "resources.gpu"
    listed = _post(client, "/api/jobs", f'{{"name": "a", "command": ["x", {digits}]}}')
    assert listed.status_code == 422 and listed.json()["field"] == "command.1"
    assert client.get("/api/jobs").json() == []


def test_a_submit_on_a_full_disk_is_a_507_naming_the_data_dir(client, service):
    kept = client.post("/api/jobs", json=SPEC).json()["id"]
    flaky = FlakyWrites(service.store, seed=0, episodes=1, rate=1.0, bursts=(1,),
                        message="database or disk is full")
    response = client.post("/api/jobs", json={**SPEC, "name": "lost"})
    assert flaky.injected == 1
    assert response.status_code == 507, response.text
    assert str(service.data_dir) in response.json()["detail"]
    assert [job["id"] for job in client.get("/api/jobs").json()] == [kept]
    assert client.post("/api/jobs", json={**SPEC, "name": "later"}).status_code == 201
    assert len(client.get("/api/jobs").json()) == 2

"""Sign-in (AUTH / AUTH_FILE): the UI and the API need it; outputs and cancel are per user."""

from __future__ import annotations

import pytest
from gradio_client import Client

from engine.auth import AuthError, Users, hash_password
from engine.settings import AppSettings
from tests.app_server import running_app
from tests.sync import HoldAtStep
from tests.test_reliability import args


def test_plain_and_hashed_passwords(tmp_path):
    auth_file = tmp_path / "users.txt"
    auth_file.write_text(f"carol:{hash_password('s3cret', iterations=1000)}\n\n")
    users = Users.parse("alice:wonder, bob:builder", str(auth_file))
    assert users("alice", "wonder") and users("bob", "builder") and users("carol", "s3cret")
    assert not users("alice", "builder") and not users("carol", "wrong") and not users("mallory", "")
    assert "s3cret" not in auth_file.read_text()


@pytest.mark.parametrize(
    ("auth", "message"),
    [("alice", "AUTH: expected user:password"), ("../etc:x", "AUTH: expected user:password with a user name")],
)
def test_bad_auth_lines_are_named(auth, message):
    with pytest.raises(AuthError, match=message):
        Users.parse(auth, None)


def test_missing_auth_file_is_named(tmp_path):
    with pytest.raises(AuthError, match="AUTH_FILE: cannot read it"):
        Users.parse(None, str(tmp_path / "nope.txt"))


def test_a_public_address_without_sign_in_is_flagged():
    assert AppSettings(server_name="0.0.0.0").exposed_without_sign_in
    assert not AppSettings(server_name="0.0.0.0", users=Users({"a": "b"})).exposed_without_sign_in
    assert not AppSettings(server_name="127.0.0.1").exposed_without_sign_in
    assert not AppSettings(server_name="0.0.0.0", on_spaces=True).exposed_without_sign_in


@pytest.fixture(scope="module")
def signed_in_app(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("auth-out")
    users = Users({"alice": "wonder", "bob": "builder"})
    with running_app(tiny_model_dir, out, users=users) as (demo, _):
        yield demo, out


def test_the_api_needs_sign_in(signed_in_app):
    demo, _ = signed_in_app
    with pytest.raises(Exception):  # noqa: B017 - gradio_client raises different errors per version
        Client(demo.local_url, verbose=False).predict(**args(), api_name="/generate")
    with pytest.raises(Exception):  # noqa: B017
        Client(demo.local_url, auth=("alice", "wrong"), verbose=False)
    images, info = Client(demo.local_url, auth=("alice", "wonder"), verbose=False).predict(
        **args(seed=5), api_name="/generate"
    )
    assert info["seeds"] == [5] and len(images) == 1


def test_outputs_and_cancel_are_per_user(signed_in_app, monkeypatch):
    """Alice's jobs are held at step 2 while the Stops come: bob's must leave hers running, hers must stop it."""
    demo, out = signed_in_app
    backend = demo.studio.engine.backend
    generate = backend.generate
    alice = Client(demo.local_url, auth=("alice", "wonder"), verbose=False)
    bob = Client(demo.local_url, auth=("bob", "builder"), verbose=False)
    hold = HoldAtStep(generate, step=2)
    monkeypatch.setattr(backend, "generate", hold)
    job = alice.submit(**args(num_images=4, steps=6, seed=7), api_name="/generate")
    assert hold.reached.wait(120), hold
    # bob knows alice's session id (worst case) and still cannot stop her job
    assert bob.predict(alice.session_hash, api_name="/stop") == {"running": 0, "queued": 0}
    hold.release()
    images, info = job.result(timeout=300)
    assert hold.held_until == "release" and info["cancelled"] is False and len(images) == 4
    assert len(list((out / "users" / "alice").rglob("*.png"))) >= 4
    assert not (out / "users" / "bob").exists()
    # alice stops her own
    hold = HoldAtStep(generate, step=2)
    monkeypatch.setattr(backend, "generate", hold)
    job = alice.submit(**args(num_images=8, steps=6, seed=8), api_name="/generate")
    assert hold.reached.wait(120), hold
    assert alice.predict("", api_name="/stop")["running"] == 1
    assert job.result(timeout=300)[1]["cancelled"] is True and hold.stopped_early(), hold


def test_history_is_per_user(signed_in_app):
    from engine.outputs import OutputStore

    _, out = signed_in_app
    store = OutputStore(out, 0, 0)
    alice = store.history("alice")
    assert alice and all("users/alice/" in str(p) for p in alice)
    assert store.history("bob") == [] and store.history(None) == []  # the shared root holds nobody's files

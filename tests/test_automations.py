"""The silence automations as Prefect's server hands them back: ``start`` leaves one that is already right alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from h3flow.pipeline.automations import silence_automations

SERVER_ROUND_TRIP = """
import json, sys
from prefect.events.schemas.automations import AutomationCore
sent = json.load(sys.stdin)
json.dump([AutomationCore.model_validate(a).model_dump(mode="json") for a in sent], sys.stdout)
"""
CLIENT_COMPARE = """
import json, sys
from prefect.events.schemas.automations import AutomationCore
from h3flow.pipeline.automations import _spec, silence_automations
back = [AutomationCore.model_validate(a) for a in json.load(sys.stdin)]
print(json.dumps([w.name for w, b in zip(silence_automations(60, 100), back) if _spec(w) != _spec(b)]))
"""


def python(code: str, stdin: str, hash_seed: int) -> str:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_automation_listed_in_the_servers_set_order_is_the_one_wanted() -> None:
    """A trigger's event sets travel as JSON lists in the order of the sending process's sets, which
    its string hashing decides. With the client's hash seed 7 and the server's 4, each of the three
    automations came back listed in another order, compared unequal, and was updated on every
    ``start`` — and an update makes Prefect forget the runs it was timing (a dispatcher killed just
    before was never marked Crashed: CI, test_pipeline's killed-dispatcher case)."""
    sent = json.dumps([a.model_dump(mode="json") for a in silence_automations(60, 100)])
    back = python(SERVER_ROUND_TRIP, sent, hash_seed=4)
    assert json.loads(back) != json.loads(sent), "the seeds no longer reorder the lists: pick another pair"
    assert json.loads(python(CLIENT_COMPARE, back, hash_seed=7)) == []

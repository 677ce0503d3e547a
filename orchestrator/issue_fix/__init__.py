"""Issue fixing: a team fixes a bug report in a real repo, its tests run in a sandbox.

    task.py       a task folder and its task.yaml
    running.py    runners (this machine, or a sandbox), fresh repo copies, patches
    grading.py    hidden tests run against a team's work: one outcome per test id
    checking.py   proving a task sound (``rolecast tasks check``)
    edits.py      the Coder's search/replace edits, confined to the work dir
    rewards.py    each role's process reward
    env.py        the ``issue_fix`` protocol: Planner -> Coder -> Reviewer -> Tester
"""

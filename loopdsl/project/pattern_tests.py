"""The loop test `loopdsl init` writes beside each bundled pattern (`loops/<name>.test.yaml`).

Each builds, in its `setup`, the small repository its reply script was written for (the
same history the pattern's own end-to-end test builds, with the same dates and identity,
so commit hashes cited by the replies match), then runs the loop offline and checks the
run's path, outputs, files and spend.
"""
from __future__ import annotations

# A shell helper every setup starts with: `commit FILE MESSAGE [DATE]` commits stdin as FILE.
_COMMIT = r'''commit() {
    mkdir -p "$(dirname "$1")" && cat > "$1" && git add -- "$1"
    if [ -n "${3:-}" ]; then
      GIT_AUTHOR_DATE="$3" GIT_COMMITTER_DATE="$3" git commit -q -m "$2"
    else
      git commit -q -m "$2"
    fi
  }
  git init -q -b main
  printf '# scratch\n' | commit README.md "initial commit" 2024-01-01T09:00:00+00:00'''

_HEADER = """# A loop test: `loopdsl test` runs it offline in a temporary directory (never in this
# repository): `setup` builds a small repository, the loop runs on it with scripted replies
# (no API key), and `expect` says what must hold. See docs/cli.md, "loopdsl test".
"""

PATTERN_TESTS: dict[str, str] = {
    "daily-triage": _HEADER + r'''loop: daily-triage.yaml
script: scripts/daily-triage.replies.yaml
copy: false
setup: |
  @@COMMIT_HELPER@@
  printf 'def main():\n    # TODO: validate the config path before opening it\n    return 0\n' |
    commit src/app.py "add app entry point" 2024-03-01T10:00:00+00:00
  printf 'def load(path):\n    # FIXME: crashes on an empty file\n    return open(path).read()\n' |
    commit src/config.py "fix: read config lazily" 2024-03-09T08:30:00+00:00
  printf '# Setup\nRun make.\n' | commit docs/setup.md "docs: setup guide" 2024-03-09T15:00:00+00:00
  cat > issues.json <<'JSON'
  [{"number": 12, "title": "Login fails with SSO", "labels": [{"name": "bug"}]},
   {"number": 15, "title": "Add dark mode", "labels": [{"name": "enhancement"}]}]
  JSON
inputs:
  since: "2024-03-09T00:00:00+00:00"
  issues_file: issues.json
expect:
  status: completed
  path: [commits, todos, issues, draft, review, draft, review, approve, publish, done]
  outputs: {items: 5}
  files:
    - {path: "triage/*.md", matches: "\\| P0 \\| Stop the crash on empty config files"}
  spend: {tokens: 60000, cost_usd: 0.25, steps: 30}
''',
    "changelog-drafter": _HEADER + r'''loop: changelog-drafter.yaml
script: scripts/changelog-drafter.replies.yaml
copy: false
setup: |
  @@COMMIT_HELPER@@
  printf '# Changelog\n\n## v0.1.0 (2024-01-05)\n\n### Added\n\n- First release.\n' |
    commit CHANGELOG.md "feat: first release" 2024-01-05T10:00:00+00:00
  GIT_COMMITTER_DATE=2024-01-05T10:00:00+00:00 git tag -a v0.1.0 -m v0.1.0
  printf 'def to_csv(rows):\n    return rows\n' | commit src/export.py "feat: export reports as CSV" 2024-02-01T10:00:00+00:00
  printf "def parse(text):\n    return text or ''\n" | commit src/parse.py "fix: handle empty input" 2024-02-02T10:00:00+00:00
  git checkout -q -b topic
  printf 'CACHE = {}\n' | commit src/cache.py "perf: cache parsed config" 2024-02-03T10:00:00+00:00
  git checkout -q main
  GIT_AUTHOR_DATE=2024-02-04T10:00:00+00:00 GIT_COMMITTER_DATE=2024-02-04T10:00:00+00:00 \
    git merge -q --no-ff -m "Merge branch 'topic'" topic
inputs:
  version: v0.2.0
expect:
  status: completed
  path: [last_tag, commits, draft, review, write, done]
  outputs: {since: v0.1.0, commits: 3}
  files:
    - {path: CHANGELOG.md, matches: "^## v0\\.2\\.0 \\("}
  spend: {tokens: 120000, cost_usd: 0.5, steps: 30}
''',
    "issue-triage": _HEADER + r'''loop: issue-triage.yaml
script: scripts/issue-triage.replies.yaml
copy: false
setup: |
  @@COMMIT_HELPER@@
  cat > issues.json <<'JSON'
  [{"number": 3, "title": "Crash when config file is empty", "body": "Traceback (most recent call last): ...", "labels": []},
   {"number": 7, "title": "API token printed in debug logs", "body": "Run with --debug and the token shows up.", "labels": []},
   {"number": 8, "title": "Typo in README install section", "labels": []},
   {"number": 11, "title": "How do I run this behind a proxy?", "labels": []}]
  JSON
inputs:
  issues_file: issues.json
  owners: {api: "@ari", docs: "@dana", core: "@org/core-team"}
expect:
  status: completed
  path: [fetch, source, classify, write, done]
  outputs: {issues: 4}
  files:
    - {path: "triage/issues-*.json", matches: '"security"'}
  spend: {tokens: 80000, cost_usd: 0.3, steps: 25}
''',
    "post-merge-cleanup": _HEADER + r'''loop: post-merge-cleanup.yaml
script: scripts/post-merge-cleanup.replies.yaml
copy: false
setup: |
  @@COMMIT_HELPER@@
  printf 'x = 1\n' | commit app.py "base work" 2024-02-01T10:00:00+00:00
  git branch feat-b
  git branch wip
  for pair in feat-a:02 feat-old:03 feat-live:04 release/1.0:05; do
    name=${pair%:*} day=${pair#*:}
    git checkout -q -b "$name" main
    printf '%s\n' "$name" | commit "$(printf '%s' "$name" | tr / -).txt" "work on $name" "2024-02-${day}T10:00:00+00:00"
    git checkout -q main
    GIT_AUTHOR_DATE="2024-02-${day}T11:00:00+00:00" GIT_COMMITTER_DATE="2024-02-${day}T11:00:00+00:00" \
      git merge -q --no-ff -m "Merge $name" "$name"
  done
  git checkout -q -b feat-x main
  printf 'x\n' | commit x.txt "unmerged work" 2024-02-06T10:00:00+00:00
  git checkout -q wip
  printf 'wip\n' | commit wip.txt "my wip" 2024-02-07T10:00:00+00:00
  git worktree add -q ../wt-old feat-old
  git worktree add -q ../wt-live feat-live
  rm -rf ../wt-old
expect:
  status: completed
  path: [head, merged, unmerged, stale, details, summarise, approve, delete, done]
  spend: {tokens: 20000, cost_usd: 0.05, steps: 20}
''',
    "pr-babysitter": _HEADER + r'''loop: pr-babysitter.yaml
script: scripts/pr-babysitter.replies.yaml
copy: false
setup: |
  @@COMMIT_HELPER@@
  printf 'def add(a, b):\n    return a + b\n' | commit calc.py "add calc.add"
  cat <<'PY' | commit test_calc.py "test calc.add"
  import unittest

  from calc import add


  class CalcTest(unittest.TestCase):
      def test_add(self):
          self.assertEqual(add(2, 3), 5)
  PY
  git branch already-merged
  git checkout -q -b feature/docs
  printf 'Call calc.add(a, b).\n' | commit docs/usage.md "document calc.add"
  git checkout -q -b fix/subtract main
  printf 'def add(a, b):\n    return a - b\n' | commit calc.py "make add subtract"
  git checkout -q main
inputs:
  source: git
  test_command: python3 -m unittest -q
expect:
  status: completed
  path: [list_prs, prs, check_each, tally, tidy, write_index, done]
  outputs: {checked: 2, failing: 1}
  files:
    - reports/README.md
    - {path: reports/fix/subtract.md, matches: "^# fix/subtract: tests fail"}
  spend: {tokens: 150000, cost_usd: 0.5, steps: 400}
''',
    "ci-sweeper": _HEADER + r'''loop: ci-sweeper.yaml
script: scripts/ci-sweeper.replies.yaml
copy: false
setup: |
  @@COMMIT_HELPER@@
  cat <<'PY' | commit calc.py "add calc"
  """Small arithmetic helpers."""


  def add(a, b):
      return a + b


  def mean(values):
      """The arithmetic mean of a non-empty list of numbers."""
      return sum(values) // len(values)
  PY
  cat <<'PY' | commit test_calc.py "test calc"
  import unittest

  from calc import add, mean


  class CalcTest(unittest.TestCase):
      def test_add(self):
          self.assertEqual(add(2, 3), 5)

      def test_mean(self):
          self.assertEqual(mean([1, 2]), 1.5)
  PY
inputs:
  test_command: python3 -m unittest -q
expect:
  status: completed
  path: [run_tests, collect, propose, apply, propose, apply, review, approve, finalize, fixed]
  outputs: {outcome: fixed, changed: calc.py}
  files:
    - {path: calc.py, matches: "return sum\\(values\\) / len\\(values\\)"}
  spend: {tokens: 200000, cost_usd: 0.75, steps: 30}
''',
    "dependency-sweeper": _HEADER + r'''loop: dependency-sweeper.yaml
script: scripts/dependency-sweeper.replies.yaml
copy: false
setup: |
  @@COMMIT_HELPER@@
  printf '# runtime\nrequests==2.31.0\nsix==1.15.0\nidna==3.4  # transitive, pinned\npytest>=7\n' |
    commit requirements.txt "pin dependencies"
  cat <<'PY' | commit check_pins.py "check the pins"
  """This project uses requests 2.x APIs: refuse any other major version."""
  import re
  import sys

  pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", open("requirements.txt").read(), re.M))
  if int(pins["requests"].split(".")[0]) != 2:
      sys.exit(f"requests {pins['requests']} is not supported: this project needs requests 2.x")
  print("pins ok:", ", ".join(f"{k}=={v}" for k, v in sorted(pins.items())))
  PY
  cat > outdated.json <<'JSON'
  [{"name": "requests", "current": "2.31.0", "latest": "3.0.0"},
   {"name": "six", "current": "1.15.0", "latest": "1.16.0"},
   {"name": "IDNA", "current": "3.4", "latest": "3.7"},
   {"name": "flask", "current": "2.0.0", "latest": "3.0.0"}]
  JSON
inputs:
  outdated_file: outdated.json
  test_command: python3 check_pins.py
expect:
  status: completed
  path: [find_outdated, plan, bump_each, tally, tidy, summarise, approve, done]
  outputs: {kept: six idna, reverted: requests}
  files:
    - {path: requirements.txt, matches: "^six==1\\.16\\.0$"}
  spend: {tokens: 40000, cost_usd: 0.1, steps: 700}
''',
}


def pattern_test(name: str) -> str | None:
    """The test file text for a bundled pattern, or None when there is none."""
    text = PATTERN_TESTS.get(name)
    return None if text is None else text.replace("@@COMMIT_HELPER@@", _COMMIT)


def generic_test(name: str, loop_file: str, script: str | None) -> str:
    """A starting point for a pattern without a written test: it checks only the spend caps
    the budget promises, so the first edit is to say what the run must do."""
    lines = [_HEADER.rstrip("\n"), "# Say what a good run does: set expect.status, expect.path and the files it writes.",
             f"loop: {loop_file}"]
    if script:
        lines.append(f"script: {script}")
    lines += ["expect:", "  status: completed"]
    return "\n".join(lines) + "\n"

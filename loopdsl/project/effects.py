"""What a shell command may change, judged from its text (for the audit).

Two classes, matched on the command as written (templates included, since a
placeholder only ever becomes one quoted argument):

- *external*: acts outside the run's workspace, where a git worktree cannot contain it:
  pushing or publishing, posting to an API, remote shells and copies, cloud and cluster
  changes, writing to an absolute path or the home folder;
- *local*: writes inside the workspace: redirections to files, file utilities,
  `sed -i`, git commands that move HEAD or the index, package installs.

A command that matches neither is treated as read-only. The lists are conservative and
published in docs/audit.md.
"""
from __future__ import annotations

import re

from ..language.model import ShellSpec

# `[^|;&\n]*` keeps a match inside one simple command of a pipeline or list.
_SAME_COMMAND = r"[^|;&\n]*"

EXTERNAL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("git push", rf"\bgit\b{_SAME_COMMAND}\bpush\b"),
    ("gh (writes to GitHub)", rf"\bgh\s+(?:pr|issue|release|repo|label|gist|secret|variable|workflow|run){_SAME_COMMAND}\b"
                              r"(?:create|comment|merge|close|edit|delete|review|reopen|ready|upload|set|run|rerun|cancel|fork|archive|transfer)\b"),
    ("gh api (write method)", rf"\bgh\s+api\b{_SAME_COMMAND}(?:-X\s*|--method\s+)(?:POST|PUT|PATCH|DELETE)\b|\bgh\s+api\b{_SAME_COMMAND}\s-(?:f|F|-field|-raw-field)\b"),
    ("HTTP write", rf"\b(?:curl|wget|http|https|xh)\b{_SAME_COMMAND}(?:-X\s*(?:POST|PUT|PATCH|DELETE)\b|--request\s+(?:POST|PUT|PATCH|DELETE)\b|\s--data\b|\s-d\s|\s--data-\w+|\s--upload-file\b|\s-T\s|\s--post-data\b|\s--form\b|\s-F\s)"),
    ("package publish", r"\b(?:npm|yarn|pnpm|cargo|poetry|gem|twine|flit|hatch|uv)\s+(?:publish|upload|push)\b"),
    ("image push", r"\b(?:docker|podman|buildah)\s+push\b"),
    ("cluster or cloud change", r"\bkubectl\s+(?:apply|delete|create|patch|scale|rollout|replace|edit)\b|\bhelm\s+(?:install|upgrade|uninstall|delete)\b"
                                r"|\bterraform\s+(?:apply|destroy|import)\b|\baws\s+\S+\s+(?:cp|sync|rm|mv|put-\S+|create-\S+|delete-\S+|update-\S+)\b"
                                rf"|\bgcloud\b{_SAME_COMMAND}\b(?:deploy|create|delete|update)\b"),
    ("remote shell or copy", r"\b(?:ssh|scp|rsync|sftp)\b"),
    ("mail", r"\b(?:sendmail|mailx?)\s"),
    ("write outside the workspace", r"(?<![0-9&])>>?\s*[\"']?(?:/(?!dev/(?:null|stdout|stderr|fd/))|~|\$HOME|\$\{HOME\})"),
)

LOCAL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("redirect to a file", r"(?<![0-9&<>])>>?(?!&)\s*(?![\"']?/dev/(?:null|stdout|stderr|fd/))[\"'$\w./{-]"),
    ("file utility", r"(?:^|[\s;&|(])(?:rm|mv|cp|mkdir|rmdir|touch|tee|ln|chmod|chown|truncate|install|unlink|dd)\s"),
    ("in-place edit", r"\b(?:sed|perl)\s+(?:-\w*\s+)*-i"),
    ("git command that changes the checkout", rf"\bgit\b{_SAME_COMMAND}\b(?:commit|checkout|switch|reset|rebase|merge|cherry-pick|revert|stash|clean|rm|mv|apply|am|tag|add|restore|pull|worktree\s+(?:add|remove)|branch\s+-[dDmMfc])\b"),
    ("package install or update", r"\b(?:pip3?|npm|yarn|pnpm|poetry|uv|cargo|go|bundle|gem)\s+(?:install|add|update|upgrade|remove|uninstall|lock|get|sync|ci)\b"),
    ("patch", r"(?:^|[\s;&|(])patch\s"),
)

_EXTERNAL = [(label, re.compile(rx, re.MULTILINE)) for label, rx in EXTERNAL_PATTERNS]
_LOCAL = [(label, re.compile(rx, re.MULTILINE)) for label, rx in LOCAL_PATTERNS]


def command_text(spec: ShellSpec) -> str:
    if spec.argv is not None:
        return " ".join(spec.argv)
    return spec.cmd or ""


def _strip_comments(text: str) -> str:
    # A `# ...` comment says nothing about what runs; `$#` and `${#x}` are not comments.
    return re.sub(r"(^|\s)#[^\n]*", r"\1", text)


def external_effects(spec: ShellSpec) -> list[str]:
    text = _strip_comments(command_text(spec))
    return [label for label, rx in _EXTERNAL if rx.search(text)]


def local_writes(spec: ShellSpec) -> list[str]:
    text = _strip_comments(command_text(spec))
    return [label for label, rx in _LOCAL if rx.search(text)]

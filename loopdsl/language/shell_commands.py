"""What a simple command does with each of its arguments: the command tables behind the shell rule.

shell_parse.py finds where a value stands; when it is an argument of a simple command, this
module decides from the command's own words whether that argument is plain data (allowed),
code (`eval`, `bash -c SCRIPT`, `trap`), a variable name (`read`, `printf -v`), an integer
bash evaluates (`let`), the program itself, or an operand a command may parse as an option.
Only literal words decide: a word holding a value is never trusted to be an option or a name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# "leading-code": code when the word starts with the value (`python3 {{ v }}` may be -cCODE),
# fine after a literal prefix (`python3 ./{{ v }}`); "option" likewise, but only a warning.
Verdict = Literal["ok", "code", "name", "integer", "command", "option", "leading-code"]


@dataclass(frozen=True)
class Word:
    literal: str | None   # the word's text when it holds no expansion at all, unquoted
    tainted: bool         # holds a placeholder or a variable that carries one
    process_substitution: bool = False   # `<(...)`: a file whose content a command writes


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    context: str          # e.g. "the script of `bash -c`", shown in the message


OK = Judgement("ok", "an argument")

# Commands that run their first operand as another command (after their own options).
# The value is the options that take a separate argument.
WRAPPERS: dict[str, frozenset[str]] = {
    "command": frozenset(), "builtin": frozenset(), "exec": frozenset({"-a"}),
    "nohup": frozenset(), "time": frozenset({"-f", "-o"}), "setsid": frozenset(),
    "env": frozenset({"-u", "-C", "--unset", "--chdir"}), "nice": frozenset({"-n"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}), "sudo": frozenset({"-u", "-g", "-C", "-h", "-p"}),
    "doas": frozenset({"-u"}), "coproc": frozenset(), "chroot": frozenset(), "flock": frozenset({"-w", "-E"}),
    "ionice": frozenset({"-c", "-n"}), "taskset": frozenset(), "unbuffer": frozenset(),
    "xargs": frozenset({"-I", "-i", "-n", "-L", "-l", "-P", "-s", "-d", "-E", "-a", "--replace",
                       "--max-args", "--max-procs", "--delimiter", "--arg-file"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
}
# Wrappers whose first operand is not yet the command (timeout's duration, flock's file).
_WRAPPER_OPERANDS = {"timeout": 1, "flock": 1, "chroot": 1, "taskset": 1}

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "fish", "busybox"})
# Interpreters and the options whose argument is a program.
INTERPRETERS: dict[str, frozenset[str]] = {
    "python": frozenset({"-c"}), "python3": frozenset({"-c"}), "python2": frozenset({"-c"}),
    "pypy3": frozenset({"-c"}), "perl": frozenset({"-e", "-E"}), "ruby": frozenset({"-e"}),
    "node": frozenset({"-e", "-p", "--eval", "--print"}), "nodejs": frozenset({"-e", "-p"}),
    "deno": frozenset({"eval"}), "php": frozenset({"-r"}), "lua": frozenset({"-e"}),
    "Rscript": frozenset({"-e"}), "osascript": frozenset({"-e"}), "tclsh": frozenset(),
    "jq": frozenset(), "awk": frozenset(), "gawk": frozenset(), "mawk": frozenset(),
    "nawk": frozenset(), "sed": frozenset({"-e", "--expression"}), "gsed": frozenset({"-e"}),
}
# Options of shells and interpreters that take the next word as a plain value.
_INTERPRETER_VALUES: dict[str, frozenset[str]] = {
    "awk": frozenset({"-v", "-F"}), "gawk": frozenset({"-v", "-F"}), "mawk": frozenset({"-v", "-F"}),
    "nawk": frozenset({"-v", "-F"}), "sed": frozenset({"-l"}), "jq": frozenset({"--indent"}),
    "bash": frozenset({"-o", "-O", "+o", "+O"}), "sh": frozenset({"-o", "+o"}),
    "python3": frozenset({"-W", "-X"}), "python": frozenset({"-W", "-X"}),
}
# Options whose next two words are a name and a plain value.
_PAIR_VALUES = frozenset({"--arg", "--argjson", "--slurpfile", "--rawfile"})
# Interpreters whose first operand is the program text itself when no file option is given.
_PROGRAM_OPERAND = {"awk": "-f", "gawk": "-f", "mawk": "-f", "nawk": "-f", "sed": "-f",
                    "gsed": "-f", "jq": "--from-file"}

# Builtins that run their arguments as code, or evaluate them as arithmetic.
CODE_BUILTINS = frozenset({"eval", "trap", "source", ".", "compgen", "complete", "alias",
                           "fc", "bind", "enable", "hash", "watch", "su", "script", "parallel"})
# Options of ordinary programs whose value is a command, a config that can name one, or a
# file of code: `git -c core.pager=CMD`, `ssh -o ProxyCommand=CMD`, `rsync -e CMD`.
_CODE_OPTIONS: dict[str, frozenset[str]] = {
    "git": frozenset({"-c", "--config-env", "--upload-pack", "-u", "--receive-pack", "--exec",
                      "--extcmd", "-x", "--exec-path"}),
    "ssh": frozenset({"-o", "-F", "-S", "-J"}), "scp": frozenset({"-o", "-F", "-S", "-J"}),
    "tar": frozenset({"-I", "--use-compress-program", "--to-command", "--checkpoint-action",
                      "--info-script", "-F", "--new-volume-script", "--rsh-command"}),
    "rsync": frozenset({"-e", "--rsh", "--rsync-path"}), "sort": frozenset({"--compress-program"}),
    "zip": frozenset({"-TT", "--unzip-command"}), "curl": frozenset({"-K", "--config"}),
    "wget": frozenset({"-e", "--execute"}), "make": frozenset({"-f", "--file", "--makefile"}),
}
ARITHMETIC_BUILTINS = frozenset({"let"})
# Builtins whose operands (or some options' arguments) are variable names.
NAME_BUILTINS = frozenset({"read", "mapfile", "readarray", "getopts", "unset", "declare",
                           "typeset", "local", "export", "readonly", "wait", "printf", "test", "["})

# Commands that parse options among their operands: a value there may be read as an option.
OPTION_COMMANDS = frozenset({
    "git", "grep", "egrep", "fgrep", "rg", "rm", "cp", "mv", "ln", "ls", "cat", "sed", "find",
    "curl", "wget", "tar", "chmod", "chown", "mkdir", "rmdir", "touch", "head", "tail", "sort",
    "uniq", "wc", "cut", "diff", "du", "df", "file", "stat", "install", "rsync", "scp", "ssh",
    "docker", "kubectl", "npm", "npx", "pip", "pip3", "make", "gh", "jq", "yq", "zip", "unzip",
    "gzip", "gunzip", "xz", "basename", "dirname", "realpath", "readlink", "tee", "od", "xxd",
    "base64", "sha256sum", "md5sum", "openssl", "patch", "less", "more", "awk", "python",
    "python3", "node", "pytest", "go", "cargo", "tr", "paste", "split", "truncate", "shred",
})
# Options of those commands known to take the next word as their value.
_VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "git": frozenset({"-C", "-c", "--git-dir", "--work-tree", "-m", "-b", "-B", "-n", "-F",
                      "--author", "--format", "--pretty", "--message", "-o", "--since",
                      "--until", "--max-count", "-e"}),  # -e: `git grep -e PATTERN`
    "grep": frozenset({"-e", "-f", "-m", "-A", "-B", "-C", "--regexp", "--file", "--include",
                       "--exclude"}),
    "rg": frozenset({"-e", "-g", "-t", "-m", "--glob", "--type", "--regexp"}),
    "curl": frozenset({"-o", "-H", "-d", "-X", "-u", "-A", "-e", "--data", "--header",
                       "--output", "--url", "--request", "--user", "-F", "--form", "-m",
                       "--max-time", "--data-raw", "--data-binary", "-w"}),
    "wget": frozenset({"-O", "-P", "--output-document"}),
    "tar": frozenset({"-f", "-C", "--file", "--directory"}), "sed": frozenset({"-i"}),
    "cp": frozenset({"-t", "--target-directory"}), "mv": frozenset({"-t", "--target-directory"}),
    "head": frozenset({"-n", "-c"}), "tail": frozenset({"-n", "-c"}),
    "sort": frozenset({"-k", "-t", "-o"}), "cut": frozenset({"-d", "-f", "-c", "-b"}),
    "find": frozenset({"-name", "-iname", "-path", "-ipath", "-newer", "-type", "-maxdepth",
                       "-mindepth", "-regex", "-iregex", "-user", "-group", "-perm", "-size",
                       "-mtime", "-mmin", "-wholename"}),
    "docker": frozenset({"-t", "-f", "-e", "-v", "-w", "--name", "--tag", "--file", "-p"}),
    "npm": frozenset({"--prefix", "-w", "--workspace"}), "make": frozenset({"-C", "-f", "-j"}),
    "jq": frozenset({"--arg", "--argjson", "-r"}), "chmod": frozenset(), "mkdir": frozenset({"-m"}),
    "pytest": frozenset({"-k", "-m", "--rootdir"}),
    "gh": frozenset({"-R", "--repo", "-t", "-b", "--title", "--body", "--token", "-L", "--limit",
                     "--base", "-B", "--head", "-H", "--state", "-s", "--json", "--jq", "-q",
                     "--search", "-S", "--label", "-l", "--add-label", "--remove-label",
                     "--add-assignee", "--assignee", "-a", "--body-file", "-F"}),
}
_END_OF_OPTIONS = frozenset({"--", "--end-of-options"})


def base_name(word: Word) -> str | None:
    if word.literal is None:
        return None
    return word.literal.rsplit("/", 1)[-1]


def _is_option(word: Word) -> bool:
    return word.literal is not None and word.literal.startswith("-") and word.literal != "-"


def unwrap(words: list[Word]) -> tuple[int, list[str]]:
    """Index of the command that really runs (past `env`, `timeout 5`, `xargs -0` ...) and
    the wrappers passed on the way."""
    start, wrappers = 0, []
    while start < len(words):
        name = base_name(words[start])
        if name not in WRAPPERS:
            return start, wrappers
        wrappers.append(name)
        i = start + 1
        takes_value = WRAPPERS[name]
        while i < len(words):
            literal = words[i].literal
            if literal in _END_OF_OPTIONS:
                i += 1
                break
            if name == "env" and literal is not None and "=" in literal and not literal.startswith("-"):
                i += 1
                continue
            if not _is_option(words[i]):
                break
            i += 2 if literal in takes_value else 1
        i += _WRAPPER_OPERANDS.get(name, 0)
        start = i
    return start, wrappers


def judge_argument(words: list[Word], index: int) -> Judgement:
    """What the command `words` does with `words[index]`, a word that holds a value."""
    start, wrappers = unwrap(words)
    if index < start:
        return OK if "xargs" not in wrappers else Judgement("option", "an option of `xargs`")
    if index == start:
        return Judgement("command", "the name of the command to run")
    name = base_name(words[start]) or ""
    args = words[start + 1:]
    at = index - start - 1
    if name in CODE_BUILTINS:
        return Judgement("code", f"an argument of `{name}`, which runs it as code")
    if name in ARITHMETIC_BUILTINS:
        return Judgement("integer", f"an argument of `{name}`, which evaluates it as arithmetic")
    if name == "find":
        segment = _exec_segment(args, at)
        if segment is not None:
            first, words_of_segment = segment
            return judge_argument(words_of_segment, at - first)
    if at > 0 and args[at - 1].literal in _CODE_OPTIONS.get(name, frozenset()):
        return Judgement("code", f"the value of `{name} {args[at - 1].literal}`, which can run a command")
    if name == "ssh" and _ssh_remote_command(args, at):
        return Judgement("code", "the remote command of `ssh`, which the remote shell runs")
    if name in SHELLS or name in INTERPRETERS:
        return _interpreter_argument(name, args, at)
    if name in NAME_BUILTINS:
        return _name_builtin_argument(name, args, at)
    if name in OPTION_COMMANDS and not _after_end_of_options(name, args, at):
        return Judgement("option", f"an operand of `{name}`, which may read it as an option")
    return OK


def _ssh_remote_command(args: list[Word], at: int) -> bool:
    """ssh joins every word after the destination into one command line for the remote shell."""
    i = 0
    while i < len(args) and _is_option(args[i]):
        i += 2 if args[i].literal in ("-p", "-i", "-l", "-o", "-F", "-J", "-L", "-R", "-D", "-S") else 1
    return at > i


_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _exec_segment(args: list[Word], at: int) -> tuple[int, list[Word]] | None:
    """The command of the `find -exec ... ;` that holds `args[at]`: (its first index, words)."""
    i = 0
    while i < len(args):
        if args[i].literal in _FIND_EXEC:
            end = i + 1
            while end < len(args) and args[end].literal not in (";", "+"):
                end += 1
            if i < at < end:
                return i + 1, args[i + 1:end]
            i = end
        i += 1
    return None


def _after_end_of_options(name: str, args: list[Word], at: int) -> bool:
    """True when `args[at]` cannot be read as an option: `--` comes first, or the word right
    before is an option known to take it as its value."""
    if any(a.literal in _END_OF_OPTIONS for a in args[:at]):
        return True
    if at > 0 and args[at - 1].literal in _VALUE_OPTIONS.get(name, frozenset()):
        return True
    return False


def _interpreter_argument(name: str, args: list[Word], at: int) -> Judgement:
    """`bash -c SCRIPT NAME ARGS...`, `python3 -c CODE`, `awk PROGRAM FILES`, `sed SCRIPT`."""
    code_flags = INTERPRETERS.get(name, frozenset({"-c"}))
    program_file_flag = _PROGRAM_OPERAND.get(name)
    has_code_flag, i = False, 0
    while i < len(args):
        word = args[i]
        if word.literal in _END_OF_OPTIONS:
            i += 1
            break
        if not _is_option(word):
            break
        literal = word.literal or ""
        if i == at:
            return Judgement("code", f"an option of `{name}`, where `-c`/`-e` would run code")
        takes_code = literal in code_flags or (name in SHELLS and _short_cluster_has(literal, "c"))
        if takes_code and name not in SHELLS:
            if i + 1 == at:
                return Judgement("code", f"the program given to `{name} {literal}`")
            i += 2
            has_code_flag = True
            continue
        has_code_flag = has_code_flag or takes_code
        if literal in _INTERPRETER_VALUES.get(name, frozenset()) or literal in _PAIR_VALUES:
            width = 3 if literal in _PAIR_VALUES else 2
            if i < at < i + width:
                return OK
            i += width
            continue
        if literal in ("-m", "-M") and name.startswith(("python", "pypy", "perl")):
            if i + 1 == at:
                return Judgement("code", f"the module `{name} {literal}` runs")
            i += 2
            continue
        if program_file_flag is not None and literal == program_file_flag:
            has_code_flag = True
            if i + 1 == at:
                return Judgement("code", f"the program file of `{name} {literal}`")
            i += 2
            continue
        i += 1
    if at < i:
        return Judgement("code", f"an option of `{name}`")
    first_operand = at == i
    if name in SHELLS and has_code_flag and first_operand:
        return Judgement("code", f"the script of `{name} -c`, which runs it as code")
    if name in _PROGRAM_OPERAND and not has_code_flag and first_operand:
        return Judgement("code", f"the program of `{name}`, which runs it as code")
    if first_operand and not has_code_flag and not any(a.literal in _END_OF_OPTIONS for a in args[:at]):
        # `python3 "$v"` with v = "-cimport os; ..." runs the value: an option needs `--` first.
        return Judgement("leading-code", f"the first operand of `{name}`, which reads a value "
                         "starting with '-' as an option such as -c (put `--` before it)")
    return OK


def _short_cluster_has(literal: str, letter: str) -> bool:
    return literal.startswith("-") and not literal.startswith("--") and letter in literal[1:]


def _name_builtin_argument(name: str, args: list[Word], at: int) -> Judgement:
    previous = args[at - 1].literal if at > 0 else None
    if name in ("test", "["):
        if previous in ("-v", "-R"):
            return Judgement("name", f"the operand of `{name} {previous}`, a variable name")
        return OK
    if name == "printf":
        # Before the format, `-v NAME` names a variable, and a value there could be `-vNAME`.
        i = 0
        while i < len(args) and (args[i].literal or "").startswith("-"):
            if args[i].literal == "--":
                i += 1
                break
            i += 2 if args[i].literal == "-v" else 1
        if at < i or (at == i and not any(a.literal == "--" for a in args[:at])):
            return Judgement("name", "an option of `printf`, where `-vNAME` names a variable")
        return OK
    if name in ("mapfile", "readarray") and previous == "-C":
        return Judgement("code", f"the callback of `{name} -C`, which bash runs as code")
    if name == "wait":
        return Judgement("name", "an argument of `wait`, whose `-p` names a variable")
    return Judgement("name", f"an argument of `{name}`, which bash reads as a variable name")


# Interpreters that run their standard input when given no program, and their code options.
_STDIN_INTERPRETERS: dict[str, frozenset[str]] = {
    name: INTERPRETERS[name] for name in ("python", "python3", "python2", "pypy3", "perl", "ruby",
                                          "node", "nodejs", "php", "lua", "Rscript", "tclsh")
}


def command_hazards(words: list[Word]) -> Judgement | None:
    """A command that turns data into code whatever its own words hold: a shell reading its
    script from standard input, `xargs sh -c` without a script, `source <(...)`."""
    start, wrappers = unwrap(words)
    if start >= len(words):
        return None
    name = base_name(words[start])
    args = words[start + 1:]
    if name in ("source", ".") and args and (args[0].literal is None or args[0].literal.startswith(
            ("/dev/stdin", "/dev/fd/", "/proc/"))):
        return Judgement("code", f"`{name}` runs a file named by an expansion, or its input, as code")
    if name in SHELLS or name in _STDIN_INTERPRETERS:
        # `-` and `--` end the options; with no script after them the program reads stdin.
        operands = [a for a in args if not _is_option(a) and a.literal not in ("-", "--")]
        flags = _STDIN_INTERPRETERS.get(name, frozenset())
        has_c = any(_short_cluster_has(a.literal or "", "c") if name in SHELLS else a.literal in flags
                    for a in args if _is_option(a))
        if not operands and not has_c:
            return Judgement("code", f"`{name}` without a script runs its standard input as code")
        first = operands[0] if operands else None
        if first is not None and not has_c and (first.tainted and first.process_substitution or (
                first.literal or "").startswith(("/dev/stdin", "/dev/fd/", "/proc/"))):
            return Judgement("code", f"`{name}` runs a script that is its input or holds a value")
        if "xargs" in wrappers and has_c and len(operands) == 0:
            return Judgement("code", "`xargs` appends its input to the script of a shell")
    if "xargs" in wrappers and name in SHELLS | set(INTERPRETERS) | CODE_BUILTINS:
        replace = any(w.literal in ("-I", "-i", "--replace") or (w.literal or "").startswith("-I")
                      for w in words[:start])
        if replace:
            return Judgement("code", "`xargs -I` puts its input inside the program of a shell")
    return None

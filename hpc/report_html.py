"""The report's one self-contained HTML page: summary table, plots, sample rollouts as conversations.

Guarantees:
- One file: CSS and JS inline, plots as PNG data URIs, no URL that leaves the page (copy it off a cluster,
  open it offline). Every string from the run is HTML-escaped.
- No raw JSON: the summary is a table of labelled values; report.json next to the page holds the data.
- Rollouts show each message under its role (system folded, task, assistant turns with their tool call,
  observations) and the outcome (status, reward, tests, diff). Text decoded from trained tokens
  (``loss_mask`` 1) is on a green background; context text (mask 0, never trained) is grey. A checkbox
  hides the context text.
- An inline error hook records script errors and ``console.error`` calls into ``#page-status``
  (``data-errors`` = their count, ``data-loaded`` = "1" after load), so a headless browser's DOM dump
  shows whether the page ran cleanly.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc.decode import Message, outcome_line
from hpc.report_summary import clock, duration, harness_line
from hpc.trajectory import Trajectory

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1240px;margin:0 auto;padding:16px 24px;
color:#1f2933;background:#fff;line-height:1.4}
h1{margin:0 0 2px}h2{margin-top:28px;border-bottom:2px solid #e4e7eb;padding-bottom:4px}
.sub{color:#616e7c;margin:0 0 16px}code{font-size:90%}
table.summary{border-collapse:collapse;min-width:60%}table.summary th{text-align:left;padding:5px 14px 5px 0;
color:#3e4c59;vertical-align:top;white-space:nowrap}table.summary td{padding:5px 0;vertical-align:top}
table.summary tr{border-bottom:1px solid #e4e7eb}.num{font-variant-numeric:tabular-nums}
.chip{display:inline-block;background:#f0f4f8;border-radius:10px;padding:0 8px;margin:1px 4px 1px 0;font-size:90%}
.plots{display:grid;grid-template-columns:repeat(2,1fr);gap:12px}figure{margin:0}
figure img{width:100%;border:1px solid #e4e7eb;border-radius:4px}figcaption{font-size:85%;color:#616e7c}
.rollout{border:1px solid #cbd2d9;border-radius:6px;margin:14px 0;padding:10px 14px}
.rollout h3{margin:0 0 6px}.best h3{color:#1b7f3b}.worst h3{color:#b42318}
.msg{margin:8px 0;border-left:4px solid #cbd2d9;padding:2px 10px}
.role{font-weight:600;font-size:85%;text-transform:uppercase;letter-spacing:.04em;color:#52606d}
.msg.assistant{border-color:#2f9e44}.msg.observation{border-color:#f59f00}.msg.task{border-color:#1c7ed6}
pre.body{white-space:pre-wrap;word-break:break-word;margin:2px 0;font:13px/1.45 ui-monospace,Menlo,Consolas,monospace}
.t{background:#d3f9d8;color:#0b3d17;border-radius:2px}.c{color:#7b8794}
body.hide-ctx .c{display:none}.legend{font-size:90%;margin:6px 0}
.outcome{background:#f8f9fa;border-radius:4px;padding:6px 10px;margin-top:8px;font-size:92%}
#page-status{display:none}
"""

HOOK = """
window.__pageErrors=[];
window.addEventListener('error',function(e){window.__pageErrors.push('error: '+e.message);});
(function(){var ce=console.error;console.error=function(){window.__pageErrors.push('console.error: '+
Array.prototype.join.call(arguments,' '));return ce.apply(console,arguments);};})();
window.addEventListener('load',function(){var s=document.getElementById('page-status');
s.setAttribute('data-errors',String(window.__pageErrors.length));s.textContent=window.__pageErrors.join('\\n');
s.setAttribute('data-loaded','1');});
"""

TOGGLE = """
document.getElementById('hide-ctx').addEventListener('change',function(e){
document.body.classList.toggle('hide-ctx',e.target.checked);});
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(x: float | int | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:.{digits}g}"


def _chips(counts: dict[str, Any]) -> str:
    return "".join(f'<span class="chip">{_e(k)} <b class="num">{_e(_num(v))}</b></span>'
                   for k, v in sorted(counts.items(), key=lambda kv: -float(kv[1]))) or "none"


def _first_last(steps: list[dict[str, Any]], key: str) -> str:
    vals = [(s["step"], s[key]) for s in steps if isinstance(s.get(key), (int, float))]
    if not vals:
        return "no trainer step yet"
    (s0, v0), (s1, v1) = vals[0], vals[-1]
    return (f'<span class="num">{_num(v0)}</span> at step {s0} &rarr; '
            f'<span class="num"><b>{_num(v1)}</b></span> at step {s1}')


def _progress(s: dict[str, Any]) -> str:
    target = "?" if s["total_steps"] is None else s["total_steps"]
    state = "finished" if s["finished"] else "not finished"
    return f'<b>{state}</b>: step <span class="num">{s["step"]}/{target}</span>'


def _reward(s: dict[str, Any]) -> str:
    if s["reward_first"] is None:
        return "no trainer step yet"
    text = (f'<span class="num">{s["reward_first"]:.2f}</span> (mean of the first {s["reward_first_steps"]} steps) '
            f'&rarr; <b class="num">{s["reward_last"]:.2f}</b> (last {s["reward_last_steps"]}), over {_e(s["reward_of"])}')
    if s.get("trained_batch_reward_first") is not None:
        text += (f'; trained batch (after filters) <span class="num">{s["trained_batch_reward_first"]:.2f}</span> '
                 f'&rarr; <span class="num">{s["trained_batch_reward_last"]:.2f}</span>')
    return text


def summary_rows(run: Path, model: str, records: list[dict[str, Any]], report: dict[str, Any]
                 ) -> list[tuple[str, str]]:
    """(label, HTML value) rows of the summary table."""
    steps = sorted((r for r in records if r.get("kind") == "train_step"), key=lambda r: r["step"])
    s = report["summary"]
    acct, fate = report["accounting"], report["tokens_by_fate"]
    tokens = (f'<span class="chip">generated <b class="num">{_num(fate["generated"])}</b></span>'
              f'<span class="chip">trained <b class="num">{_num(fate["trained"])}</b></span>'
              f'dropped by reason: {_chips(fate["dropped"])} '
              f'<span class="chip">other not trained <b class="num">{_num(fate["not_trained_other"])}</b></span>'
              f'<span class="chip">context (masked, never trained) <b class="num">{_num(fate["context"])}</b></span>')
    per_m = acct.get("gpu_hours_per_million_trained_tokens")
    return [
        ("Run", f"<b>{_e(run.name)}</b> <code>{_e(run)}</code>"),
        ("Model", f"<code>{_e(model or 'unknown')}</code>"),
        ("Progress", _progress(s)),
        ("Wall time", f'<b class="num">{_e(duration(s["duration_s"]))}</b> from {_e(clock(s["start"]))} to '
                      f'{_e(clock(s["end"]))} (first and last metrics record)'),
        ("Reward", _reward(s)),
        ("Pass rate (trained batch)", _first_last(steps, "pass_rate")),
        *([("Non-finite steps", f'<b class="num">{_e(s["nonfinite_steps"])}</b> (skipped: nothing applied)')]
          if s.get("nonfinite_steps") is not None else []),
        ("Episodes", f'<span class="num">{acct["episodes"]}</span> by status: {_chips(acct["episodes_by_status"])}'),
        *([("Harness segments", _e(harness_line(s["harness"])))] if s.get("harness") else []),
        ("Samples dropped", _chips(acct["samples_discarded_by_reason"])),
        ("Tokens by fate", tokens),
        ("Compute", f'CPU <b class="num">{_num(acct["cpu_hours"])}</b> h, GPU <b class="num">{_num(acct["gpu_hours"])}'
                    f'</b> h, sandbox <b class="num">{_num(acct["sandbox_hours"])}</b> h '
                    f'<span class="sub">({_e(acct["hours_source"])})</span>'),
        ("Waste", f'<b class="num">{acct["waste_percent"]:.1f} %</b> of generated tokens not trained'
                  + (f'; {_num(per_m)} GPU-h per million trained tokens' if per_m else "")),
        ("Idle (hpc.overlap)", "".join(f'<span class="chip">{_e(k.replace("_", " "))} <b class="num">'
                                       f'{"n/a" if v is None else f"{100 * v:.1f} %"}</b></span>'
                                       for k, v in report.get("overlap", {}).items())),
    ]


def _pieces(m: Message) -> str:
    return "".join(f'<span class="{"t" if p.trained else "c"}">{_e(p.text)}</span>' for p in m.pieces)


def _message(m: Message, turn: int) -> str:
    label = m.role + (f" {turn}" if m.role in ("assistant", "observation") else "")
    if m.role == "assistant" and not m.closed:
        label += " (cut off: no end of turn)"
    body = f'<pre class="body">{_pieces(m)}</pre>'
    if m.role == "system":
        return (f'<div class="msg system"><details><summary class="role">{_e(label)} '
                f'({len(m.text):,} characters)</summary>{body}</details></div>')
    return f'<div class="msg {_e(m.role)}"><div class="role">{_e(label)}</div>{body}</div>'


def _outcome(traj: Trajectory) -> str:
    metrics = traj.metrics
    diff = metrics.get("diff")
    diff_html = (f'<details><summary>final diff</summary><pre class="body">{_e(diff)}</pre></details>'
                 if isinstance(diff, str) and diff else
                 "<div>The diff text is not stored in the trajectory; its size and whether it applied are above.</div>")
    line = " &middot; ".join(_e(part) for part in outcome_line(traj.meta()).split("  "))
    return f'<div class="outcome"><b>Outcome</b>: {line}{diff_html}</div>'


def rollout_html(kind: str, traj: Trajectory, messages: Sequence[Message]) -> str:
    """One sample rollout: a heading with its numbers, each message, the outcome."""
    turns: dict[str, int] = {}
    parts = []
    for m in messages:
        turns[m.role] = turns.get(m.role, 0) + 1
        parts.append(_message(m, turns[m.role]))
    reward = "-" if traj.reward is None else f"{traj.reward:g}"
    return (f'<section class="rollout {_e(kind)}"><h3>{_e(kind.capitalize())}: reward {_e(reward)}</h3>'
            f'<div class="sub"><code>{_e(traj.trajectory_id)}</code> &middot; {traj.num_tokens:,} tokens, '
            f'{traj.num_generated:,} trained &middot; status {_e(traj.status.value)}</div>'
            f'{"".join(parts)}{_outcome(traj)}</section>')


def _figures(pngs: dict[str, Path], titles: dict[str, str]) -> str:
    return "".join(
        f'<figure><img alt="{_e(titles[n])}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        "</figure>" for n, p in pngs.items())


def page(run: Path, rows: list[tuple[str, str]], pngs: dict[str, Path], titles: dict[str, str],
         rollouts: list[str], samples_from: str, skipped: dict[str, str], *, config: str = "") -> str:
    """The whole page (see the module docstring)."""
    table = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    skip = "".join(f"<li>{_e(titles.get(k, k))}: {_e(v)}</li>" for k, v in skipped.items())
    samples = ("".join(rollouts) if rollouts else f"<p>No scored trajectory found in {_e(samples_from)}.</p>")
    legend = ('<div class="legend"><span class="t">trained text</span> was generated by the policy and is in the '
              'loss; <span class="c">grey text</span> is context (prompt, observations), never trained. '
              '<label><input type="checkbox" id="hide-ctx"> hide context</label></div>')
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>spoolrl report: {_e(run.name)}</title><script>{HOOK}</script><style>{CSS}</style></head><body>"
            f"<h1>spoolrl report: {_e(run.name)}</h1><p class='sub'>{_e(run)}</p>"
            f"<h2>Summary</h2><table class='summary'>{table}</table>"
            f"<h2>Plots</h2><div class='plots'>{_figures(pngs, titles)}</div>"
            f"{'<h2>Not plotted</h2><ul>' + skip + '</ul>' if skip else ''}"
            f"<h2>Sample rollouts</h2><p class='sub'>Best and worst by reward among {_e(samples_from)}.</p>"
            f"{legend}{samples}<h2>Configuration</h2><details><summary>run.yaml (the frozen config)</summary>"
            f"<pre class='body'>{_e(config)}</pre></details>"
            f"<p class='sub'>Every plotted series and the accounting are in report.json "
            f"next to this page.</p><div id='page-status'></div><script>{TOGGLE}</script></body></html>\n")

"""English alert strings (Slack, generic webhooks, Alertmanager by default).

Every user-visible string of an alert lives here and in
gpuguard_messages_zh.py, key for key and placeholder for placeholder
(tests/test_alerts.py checks both)."""
MESSAGES = {
    # state tags in titles
    "tag_firing": "ALERT",
    "tag_reminder": "REMINDER",
    "tag_resolved": "RESOLVED",
    "tag_test": "TEST",
    # titles
    "title_one": "[gpuguard {tag}] {host}: {what}",
    "title_digest": "[gpuguard {tag}] {host}: {n} alerts ({summary})",
    "summary_firing": "{n} firing",
    "summary_resolved": "{n} resolved",
    "what_idle": "GPU {gpus} idle but occupied",
    "what_idle_resolved": "GPU {gpus} no longer idle",
    "what_leak": "PID {pid} {name}: GPU memory leak suspected",
    "what_leak_escalated": "PID {pid} {name}: GPU memory leak getting worse",
    "what_leak_resolved": "PID {pid} {name} GPU memory stopped growing",
    "what_leak_gone": "PID {pid} {name} ended: its GPU memory leak alert is closed",
    "what_monitor": "cannot read GPU state",
    "what_monitor_resolved": "nvidia-smi answers again",
    "what_test": "alert channel test",
    "what_other": "event {kind}",
    # idle, firing
    "idle_head": "GPU {gpus}{model} idle {idle}, held by {job}",
    "idle_spin": "Utilization high but power near the idle floor: kernels are spin-waiting (a hung collective?)",
    "idle_power": "Power draw is under the set share of its limit: kernels may be spin-waiting",
    "idle_values": "utilization {util} (threshold {threshold}%), power {power}, memory held {memory}",
    "idle_uuids": "UUID {uuids}",
    "idle_cost": "idle so far costs ≈ {cost} ({gpu_hours} GPU-h at {price}/GPU-h)",
    "idle_hint": "Check: py-spy dump --pid {pid} (where is it stuck?); NCCL_DEBUG=INFO (a dead rank?); data loader workers alive?",
    # idle, resolved
    "idle_busy": "GPU {gpus} busy again (utilization {util}) after {idle} idle; job {job}",
    "idle_released": "GPU {gpus} released: processes gone, memory freed, after {idle} idle; job {job}",
    "idle_gone": "GPU {gpus} no longer listed by nvidia-smi; job {job}",
    "idle_resolved_other": "GPU {gpus} no longer idle ({reason}) after {idle}; job {job}",
    # job identity
    "job_slurm": "Slurm job {id}",
    "job_container": "container {id}",
    "job_cmd": "{cmd}",
    "job_pid": "PID {pid}",
    "job_unknown": "an unknown job (process list not visible: container?)",
    "job_user": "user {user}",
    "job_pids": "PID {pids}",
    "job_started": "started {start} (running {elapsed})",
    "job_cmdline": "command: {cmd}",
    "job_cwd": "cwd: {cwd}",
    "job_rank": "rank {rank}",
    "job_host": "host {host}",
    "job_other": "Also held by: {details}",
    "procs": "Processes: {procs}",
    "procs_hidden": "(process list not visible: container?)",
    "more": "... and {n} more",
    "digest_more": "... and {n} more alerts (see events.jsonl)",
    "truncated": "…(truncated)",
    # leak
    "leak_values": "Growing {slope} MiB/h (window {window}), now {used}, GPU free {free}",
    "leak_oom": "Projected OOM in {oom}",
    "leak_plateau": "Loss has plateaued while memory still grows: likely a leak",
    "leak_falling": "Loss is still falling",
    "leak_hint": "What to do: look for tensors kept with their graph (loss summed without .item()) or caches that never shrink; save a checkpoint first.",
    "leak_resolved": "Now {used}, slope {slope} MiB/h",
    "leak_gone": "It held {used} when last seen",
    # stuck (spinning), firing
    "what_stuck": "GPU {gpus} stuck: busy at idle power",
    "what_stuck_resolved": "GPU {gpus} no longer stuck",
    "stuck_head": "GPU {gpus}{model} stuck: {util} busy at {power} ({pct} of {limit}) for {cycles} cycles — a hung collective or spin-wait?",
    "stuck_held": "Held by {job}, stuck for {idle}",
    "stuck_values": "memory held {memory}; power under {threshold}% of the limit counts as the idle floor",
    "stuck_hint": "Check: py-spy dump --native --pid {pid} (which call waits?); rerun with NCCL_DEBUG=INFO; check the other ranks (one dead or slow rank makes the rest spin)",
    # stuck, resolved
    "stuck_busy": "GPU {gpus} working again (power {power}) after {idle} stuck; job {job}",
    "stuck_released": "GPU {gpus} released: processes gone after {idle} stuck; job {job}",
    "stuck_resolved_other": "GPU {gpus} no longer stuck ({reason}) after {idle}; job {job}",
    # device fault
    "tag_critical": "CRITICAL",
    "what_degraded": "GPU {gpus} faulted: {fault}",
    "what_degraded_resolved": "GPU {gpus} reads normally again",
    "degraded_head": "GPU {gpus}{model}: nvidia-smi prints \u201c{fault}\u201d for {cycles} cycles; jobs on it cannot run",
    "degraded_hint": "Check: nvidia-smi -q -i {index}; dmesg | grep -i xid (the Xid code says why); a reset (nvidia-smi -r -i {index}) needs the GPU idle: stop its jobs first",
    "degraded_resolved": "GPU {gpus}{model} reads normally again after {cycles} faulted cycles",
    "degraded_gone": "GPU {gpus}{model} is no longer listed by nvidia-smi (after {cycles} faulted cycles)",
    # leak, detector fields
    "tag_note": "NOTE",
    "what_leak_trend": "PID {pid} {name}: GPU memory grows slowly (trend note, not urgent)",
    "leak_since": "Growing since {since} ({ago} ago)",
    "leak_oom_at": "Projected OOM in {oom} (about {clock})",
    "leak_trend_note": "OOM {oom} away at this rate: a trend note for a ticket, not a page",
    "leak_escalated": "Sent as a {was} at {when}; the memory kept growing and the OOM is nearer now",
    "level_info": "trend note",
    "level_warning": "warning",
    "leak_verdict": "Verdict: {trend}, confidence {confidence}",
    "leak_rank": "Leaking: rank {rank}, PID {pid} (of the process tree of PID {root})",
    "leak_member": "Leaking: PID {pid} (of the process tree of PID {root})",
    "leak_rank_fastest": "Fastest-growing: rank {rank}, PID {pid} (of the process tree of PID {root})",
    "leak_peers_flat": "Its {peers} peer ranks stay flat: one rank growing alone is a leak's signature (they all run the same code on alike shapes)",
    "leak_ranks_in_step": "All {n} ranks grow in step: more often new data shapes (longer sequences, bigger batches) than a leak, though a leak in the training step does the same; look at the data first",
    "leak_ranks_some": "{k} of the {n} ranks are growing",
    "trend_steady": "steady growth",
    "trend_accelerating": "accelerating",
    "trend_steps": "growing in steps",
    "trend_phase": "steady growth across phases",
    "trend_decelerating": "decelerating (a cache filling up?)",
    # monitor
    "monitor_failed": "nvidia-smi failed {failures} cycles in a row: {error}",
    "monitor_hint": "Idle alerts are paused until it recovers; check the driver (Xid in dmesg).",
    "monitor_resolved": "after {failures} failed cycles",
    # test
    "test_body": "If you can read this, GPU alerts reach you.",
    # units
    "unknown": "?",
    "dur_hm": "{h} h {m} min",
    "dur_m": "{m} min",
    "dur_s": "{s} s",
    "currency": "",
    "gib": "{v:.1f} GiB",
    "mem_each": "{n} × {each}",
    # ledger (python/gpuguard_ledger.py): the daily digest and gpuguard ledger
    "tag_ledger": "DAILY",
    "ledger_what": "GPU ledger {span}",
    "ledger_head": "{idle} GPU-hours held idle ({pct}% of {held} GPU-hours held were idle or stuck)",
    "ledger_head_cost": ", wasted {cost}",
    "ledger_users": "By user (idle / held, GPU-hours):",
    "ledger_user": "{user}: idle {idle} / held {held}, longest idle stretch {longest}",
    "ledger_user_cost": ", wasted {cost}",
    "ledger_more_users": "and {n} more users",
    "ledger_worst": "Worst incidents:",
    "ledger_slurm": "Slurm job {id}",
    "ledger_incident": "{n}. GPU {gpus} idle for {longest} (until {end}): {who}",
    "ledger_incident_day": "{n}. GPU {gpus} idle for {longest} ({day}, until {end}): {who}",
    "ledger_trend": "Idle GPU-hours, last {n} days: {days}",
    "ledger_trend_weeks": "Idle GPU-hours a week, last {n} weeks: {days}",
    "ledger_trend_months": "Idle GPU-hours every 30 days, last {n} periods: {days}",
    "ledger_change": "; {pct}% on the {n} days before",
    "ledger_in_digest": "{what}: {head}",
}


# The wording for Ascend NPUs (lib/npu.sh): NPU for GPU, npu-smi for
# nvidia-smi; the fault hint names npu-smi's health query instead of Xid.
NPU_MESSAGES = {key: text.replace("GPU", "NPU").replace("nvidia-smi", "npu-smi")
                for key, text in MESSAGES.items()}
NPU_MESSAGES["degraded_hint"] = "Check: npu-smi info -t health -i CARD (the card of device {index}: npu-smi info -m maps them); npu-smi info; dmesg. A reset needs the NPU idle: stop its jobs first"
# NCCL and Xid are NVIDIA's: an NPU job talks through HCCL, whose logs
# ASCEND_GLOBAL_LOG_LEVEL turns up, and npu-smi reports a chip's health.
NPU_MESSAGES["idle_hint"] = "Check: py-spy dump --pid {pid} (where is it stuck?); ASCEND_GLOBAL_LOG_LEVEL=1 for HCCL's logs (a dead rank?); data loader workers alive?"
NPU_MESSAGES["stuck_hint"] = "Check: py-spy dump --native --pid {pid} (which call waits?); rerun with ASCEND_GLOBAL_LOG_LEVEL=1 for HCCL's logs; check the other ranks (one dead or slow rank makes the rest spin)"
NPU_MESSAGES["monitor_hint"] = "Idle alerts are paused until it recovers; check the driver (npu-smi info -t health -i CARD; dmesg)."

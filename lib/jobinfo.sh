# shellcheck shell=bash
# Who holds a GPU: the job behind a PID that nvidia-smi lists, read from
# /proc without forks (a cycle may ask for dozens of PIDs).
#
# A job is the process the user started: walking up from the GPU process,
# each parent is taken in until the process reached leads its own session
# (setsid, Slurm tasks, Jupyter kernels, daemons), or its parent is PID 0/1,
# a known supervisor (sshd, tmux, screen, sudo, su, login, systemd, cron,
# containerd-shim, runc, conmon, tini, slurmstepd, ...) or a shell that leads
# its session (a login, terminal or tmux-pane shell). So `torchrun ...
# train.py` (whose workers hold the GPUs), `timeout 60 python3 work.py` and
# `bash train.sh` are jobs, and the terminal they run in is not. A session
# or a process group alone would not do: scripts run without job control
# (every job of a script shares its group), and one terminal session holds
# many jobs. The job's "pids" are the GPU processes of the last smi_sample
# that share the job's top process.
#
# Nothing false: a PID that this PID namespace cannot see (the driver lists
# host PIDs; a container sees its own) or that is another process here (its
# open files, when readable, hold no /dev/nvidia*) gives a job with only the
# PID and "visible": false. Fields that cannot be read are null.
#
# Secrets never leave: the command line is masked (see jobinfo_mask_args_into)
# and from /proc/PID/environ only SLURM_JOB_ID, RANK, LOCAL_RANK and
# SLURM_PROCID are read.

# Parents that end the walk up to a job's top process.
JOBINFO_STOP_RE='^(init|systemd|sshd|sshd-session|tmux.*|screen|SCREEN|sudo|su|login|cron|CRON|crond|atd|containerd-shim.*|runc|conmon|docker-init|tini|dumb-init|slurmstepd|supervisord|mosh-server|byobu.*)$'
JOBINFO_SHELL_RE='^(bash|sh|dash|zsh|fish|ksh|mksh|tcsh|csh)$'
# Names of options and key=value pairs whose value is a secret.
# A name ending in -key, _pass or .pwd (--wandb-key, --db-pass, --key) is
# taken for a secret too: masking a sort key now and then costs a reader
# little, a key left in a chat message costs its owner a rotation.
JOBINFO_SECRET_NAME='(api[-_.]?keys?|apikey|jwt|cookie|access[-_.]?key|secret[-_.]?key|private[-_.]?key|token|secret|password|passwd|passphrase|credentials?|auth|[-_.]key|[-_.]pass|[-_.]pwd)'
# Well-known token shapes (Hugging Face, OpenAI, GitHub, Slack, GitLab, AWS).
JOBINFO_TOKEN_RE='(hf_|sk-|ghp_|gho_|ghs_|ghu_|github_pat_|xox[abprs]-|glpat-|AKIA)[A-Za-z0-9_-]{12,}'
# Command lines longer than this are cut in the middle.
JOBINFO_CMDLINE_MAX=300

# Forgets what was read about PIDs (call once a cycle: PIDs are reused).
jobinfo_reset() {
  declare -gA JOBINFO_TOP=() JOBINFO_STAT=() JOBINFO_USERS=()
}

# Reads /proc/PID/stat into the array named $2: (ppid pgrp sid starttime
# comm). Returns 1 when the process is not visible.
jobinfo_stat_into() {
  local pid=$1
  local -n stat_ref=$2
  if [[ -n ${JOBINFO_STAT[$pid]+set} ]]; then
    # shellcheck disable=SC2206 # cached "ppid pgrp sid start comm"
    stat_ref=(${JOBINFO_STAT[$pid]})
    ((${#stat_ref[@]})) || return 1
    return 0
  fi
  JOBINFO_STAT[$pid]=''
  stat_ref=()
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  local -a a
  gg_proc_stat_into "/proc/$pid/stat" a || return 1
  # ppid pgrp session ... starttime is field 22
  ((${#a[@]} > 21)) || return 1
  stat_ref=("${a[3]}" "${a[4]}" "${a[5]}" "${a[21]}" "${a[1]//[[:space:]]/_}")
  JOBINFO_STAT[$pid]="${stat_ref[*]}"
}

# shellcheck disable=SC2034 # top_ref: nameref, assigns the caller's variable
# Puts the top process of PID's job (see the module comment) into $2;
# PID itself when it cannot be read.
jobinfo_top_into() {
  local pid=$1 cur parent depth=0
  local -n top_ref=$2
  if [[ -n ${JOBINFO_TOP[$pid]:-} ]]; then
    top_ref=${JOBINFO_TOP[$pid]}
    return 0
  fi
  local -a st pst
  cur=$pid
  while ((depth < 64)) && jobinfo_stat_into "$cur" st; do
    depth=$((depth + 1))
    parent=${st[0]}
    # a session leader started a session of its own (setsid, Slurm tasks,
    # Jupyter kernels, daemons): its parents are not part of the job
    ((st[2] == cur)) && break
    ((parent > 1)) || break
    jobinfo_stat_into "$parent" pst || break
    [[ ${pst[4]} =~ $JOBINFO_STOP_RE ]] && break
    # a shell leading its session is a terminal, tmux pane or ssh session
    [[ ${pst[4]} =~ $JOBINFO_SHELL_RE ]] && ((pst[2] == parent)) && break
    cur=$parent
  done
  JOBINFO_TOP[$pid]=$cur
  top_ref=$cur
}

# Returns 0 when PID has a GPU device file open, 1 when it is not visible or
# its open files are readable and none is a GPU device (so this PID is
# another process than the one the driver means), 2 when that cannot be told
# (another user's process, read without root). One fork.
# Globals:
#   JOBINFO_DEVICE_GLOB: what a GPU device file looks like (/dev/nvidia*;
#   the environment may change it, as the tests do); an NPU's /dev/davinci*
#   counts too
jobinfo_holds_gpu() {
  local pid=$1 hit
  [[ -d /proc/$pid ]] || return 1
  [[ -r /proc/$pid/fd && -x /proc/$pid/fd ]] || return 2
  # /dev/davinci*: what a process on an Ascend NPU holds open (lib/npu.sh)
  hit=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 \( -lname "${JOBINFO_DEVICE_GLOB:-/dev/nvidia*}" \
    -o -lname /dev/davinci\* \) -print -quit 2>/dev/null) || return 2
  [[ -n $hit ]] && return 0
  return 1
}

# Reads /proc/PID/cmdline into the array named $2 (empty when unreadable or
# a kernel thread).
jobinfo_args_into() {
  local -n args_ref=$2
  args_ref=()
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  { mapfile -d '' -t args_ref <"/proc/$1/cmdline"; } 2>/dev/null || args_ref=()
}

# Masks secrets in a command line's arguments and joins them, shortened,
# into the variable named $1, as printable UTF-8 text.
# Arguments:
#   $1 output variable, $2... the arguments
# Masked: the value after `--api-key`, `--token`, `--password`, `--secret`...
# (any option whose name ends in one of JOBINFO_SECRET_NAME), `--api-key=X`,
# `password=X`/`HF_TOKEN=X` anywhere in an argument, the password of
# `scheme://user:pass@host`, `key`/`sig` query parameters, the token in a
# Slack, Feishu or Discord webhook's path, the word after a lone `Bearer`,
# the value of an Authorization, Cookie or X-...-Key/Token header given as
# an argument (`-H X-Api-Key:K`) and token shapes.
# shellcheck disable=SC2034 # masked_ref: nameref, assigned through gg_printable_into
jobinfo_mask_args_into() {
  local -n masked_ref=$1
  shift
  local jm_restore_case=0
  shopt -q nocasematch || jm_restore_case=1
  shopt -s nocasematch
  local jm_arg jm_out='' jm_mask_next=0 jm_n
  local jm_flag_re="^--?[A-Za-z0-9_.-]*${JOBINFO_SECRET_NAME}$"
  local jm_flag_eq_re="^(--?[A-Za-z0-9_.-]*${JOBINFO_SECRET_NAME})="
  # the same flag and its value inside one argument: a whole command given
  # as one (`bash -c "python3 train.py --api-key K"`, Kubernetes'
  # `sh -c`), where the value is the next word, not the next argument
  local jm_flag_in_re="(^|[[:space:]])(--?[A-Za-z0-9_.-]*${JOBINFO_SECRET_NAME})[[:space:]]+[^[:space:]]+"
  local jm_pair_re="[A-Za-z0-9_.-]*${JOBINFO_SECRET_NAME}=[^&;,[:space:]]+"
  local jm_query_re='[?&](key|sig|sign|signature|code)=[^&;,[:space:]]+'
  local jm_url_re='://[^/@:[:space:]]*:[^/@[:space:]]+@'
  local jm_bearer_re='bearer[[:space:]]+[^[:space:]]+'
  # an HTTP header given as an argument (curl-style -H/--header NAME:VALUE)
  local jm_header_re='^((proxy-)?authorization|cookie|x-[a-z0-9-]*(key|token|secret|auth)[a-z0-9-]*)(:[[:space:]]*)[^[:space:]]'
  # webhooks whose secret is a path segment: Slack, Feishu/Lark, Discord
  local jm_path_re='(hooks\.slack\.com/(services|workflows|triggers)|/open-apis/bot/v2/hook|discord(app)?\.com/api/webhooks)/[^[:space:]?#&]+'
  for jm_arg in "$@"; do
    if ((jm_mask_next)); then
      jm_arg='***'
      jm_mask_next=0
    elif [[ $jm_arg =~ $jm_flag_re || $jm_arg == bearer ]]; then
      # (a header split over arguments: -H Authorization: Bearer TOKEN)
      jm_mask_next=1
    elif [[ $jm_arg =~ $jm_flag_eq_re ]]; then
      jm_arg="${BASH_REMATCH[1]}=***"
    elif [[ ! $jm_arg =~ $jm_bearer_re && $jm_arg =~ $jm_header_re ]]; then
      # (a Bearer header keeps its scheme: masked below)
      jm_arg="${BASH_REMATCH[1]}${BASH_REMATCH[4]}***"
    else
      jobinfo_mask_matches_into jm_arg "$jm_arg" "$jm_flag_in_re" flag
      jobinfo_mask_matches_into jm_arg "$jm_arg" "$jm_url_re" url
      jobinfo_mask_matches_into jm_arg "$jm_arg" "$jm_path_re" path
      jobinfo_mask_matches_into jm_arg "$jm_arg" "$jm_pair_re" pair
      jobinfo_mask_matches_into jm_arg "$jm_arg" "$jm_query_re" pair
      jobinfo_mask_matches_into jm_arg "$jm_arg" "$jm_bearer_re" word
      jobinfo_mask_matches_into jm_arg "$jm_arg" "$JOBINFO_TOKEN_RE" token
    fi
    [[ $jm_arg == *[[:space:]]* || -z $jm_arg ]] && jm_arg="'$jm_arg'"
    jm_out+="${jm_out:+ }$jm_arg"
  done
  ((jm_restore_case)) && shopt -u nocasematch
  jm_n=${#jm_out}
  if ((jm_n > JOBINFO_CMDLINE_MAX)); then
    local jm_head jm_tail
    gg_cut_into jm_head "$jm_out" $((JOBINFO_CMDLINE_MAX - 80))
    gg_cut_into jm_tail "$jm_out" 70 tail
    jm_out="$jm_head … $jm_tail"
  fi
  # no raw newline, escape sequence or invalid UTF-8 reaches a message or
  # a terminal (after the cut: a long binary argument costs nothing)
  gg_printable_into masked_ref "$jm_out"
}

# Replaces every match of a regular expression in $2 by its masked form,
# left to right, into the variable named $1.
# Arguments:
#   $1 output variable, $2 text, $3 regex, $4 how: url (user:***@), pair
#   (name=***), path (the webhook's folder/***), word (first word ***),
#   flag (what precedes it, the flag, ***), token (prefix***)
jobinfo_mask_matches_into() {
  local -n mm_ref=$1
  local jx_rest=$2 jx_re=$3 jx_how=$4 jx_out='' jx_match jx_repl
  while [[ -n $jx_rest && $jx_rest =~ $jx_re ]]; do
    jx_match=${BASH_REMATCH[0]}
    case $jx_how in
      url)
        jx_repl=${jx_match#://}
        jx_repl="://${jx_repl%%:*}:***@"
        ;;
      pair) jx_repl="${jx_match%%=*}=***" ;;
      path) jx_repl="${BASH_REMATCH[1]}/***" ;;
      word) jx_repl="${jx_match%%[[:space:]]*} ***" ;;
      flag) jx_repl="${BASH_REMATCH[1]}${BASH_REMATCH[2]} ***" ;;
      token) jx_repl="${BASH_REMATCH[1]}***" ;;
    esac
    jx_out+="${jx_rest%%"$jx_match"*}$jx_repl"
    jx_rest=${jx_rest#*"$jx_match"}
  done
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  mm_ref=$jx_out$jx_rest
}

# Puts the uid and user name of PID into the variables named $2 and $3
# ('' when unknown; the name stays '' for a uid without a passwd entry, as
# in a container whose users the host does not know).
jobinfo_user_into() {
  local ju_pid=$1 ju_line ju_uid='' ju_name='' ju_entry
  local -n uid_ref=$2 name_ref=$3
  while IFS= read -r ju_line; do
    if [[ $ju_line == Uid:* ]]; then
      read -r _ ju_uid _ <<<"$ju_line"
      break
    fi
  done 2>/dev/null <"/proc/$ju_pid/status" || true
  if [[ $ju_uid =~ ^[0-9]+$ ]]; then
    if [[ -n ${JOBINFO_USERS[$ju_uid]+set} ]]; then
      ju_name=${JOBINFO_USERS[$ju_uid]}
    else
      ju_entry=$(getent passwd "$ju_uid" 2>/dev/null) || ju_entry=''
      ju_name=${ju_entry%%:*}
      JOBINFO_USERS[$ju_uid]=$ju_name
    fi
  else
    ju_uid=''
  fi
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  uid_ref=$ju_uid name_ref=$ju_name
}

# Reads the named variables from /proc/PID/environ (readable by root and
# the owner) into the associative array named $2. Only these names are kept.
jobinfo_environ_into() {
  local pid=$1 entry key
  local -n env_ref=$2
  shift 2
  local -A wanted=()
  for key in "$@"; do wanted[$key]=1; done
  local -a entries=()
  { mapfile -d '' -t entries <"/proc/$pid/environ"; } 2>/dev/null || return 0
  for entry in "${entries[@]}"; do
    key=${entry%%=*}
    # shellcheck disable=SC2034 # nameref: assigns the caller's array
    [[ -n ${wanted[$key]:-} ]] && env_ref["$key"]=${entry#*=}
  done
  return 0
}

# Puts the container a process runs in, from /proc/PID/cgroup, into the
# variable named $2: "docker:ID12", "containerd:ID12", "podman:ID12",
# "kubepods:POD-UID" ('' on the host).
jobinfo_container_into() {
  jobinfo_container_from_file "/proc/$1/cgroup" "$2"
}

# The same, from a cgroup file ($1).
jobinfo_container_from_file() {
  local line id='' kind=''
  local -n container_ref=$2
  local re_docker='docker[-/]([0-9a-f]{64})'
  local re_cri='cri-containerd[-:]([0-9a-f]{64})'
  local re_podman='libpod-([0-9a-f]{64})'
  local re_pod='kubepods.*pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})'
  while IFS= read -r line; do
    if [[ $line =~ $re_pod ]]; then
      kind=kubepods id=${BASH_REMATCH[1]//_/-}
      break
    elif [[ $line =~ $re_docker ]]; then
      kind=docker id=${BASH_REMATCH[1]:0:12}
    elif [[ $line =~ $re_cri ]]; then
      kind=containerd id=${BASH_REMATCH[1]:0:12}
    elif [[ $line =~ $re_podman ]]; then
      kind=podman id=${BASH_REMATCH[1]:0:12}
    fi
  done 2>/dev/null <"$1" || true
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  container_ref=${kind:+$kind:$id}
}

# Puts a JSON string literal (or null for '') of $1 into the variable $2.
jobinfo_json_str_into() {
  local -n js_ref=$2
  if [[ -z $1 ]]; then
    js_ref=null
    return 0
  fi
  local esc
  gg_json_escape_into "$1" esc
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  js_ref="\"$esc\""
}

# ARCHITECTURE.md, rule 5: puts a JSON object describing the job of a GPU process into
# the variable named $2:
#   {"user","uid","pid","pids","cmdline","cwd","start_ts","elapsed_s",
#    "slurm_job","container","rank","local_rank","visible"}
# "pid" is the job's top process, "pids" its processes in the last
# nvidia-smi sample (SMI_PIDS_MEM); unknown fields are null.
# Arguments:
#   $1 a PID as nvidia-smi printed it, $2 output variable
jobinfo_json_into() {
  local ji_pid=$1
  local -n job_ref=$2
  declare -p JOBINFO_TOP &>/dev/null || jobinfo_reset
  # shellcheck disable=SC2034 # filled by jobinfo_stat_into; only its status is used
  local -a ji_st
  local ji_rc=0
  jobinfo_holds_gpu "$ji_pid" || ji_rc=$?
  if ((ji_rc == 1)) || ! jobinfo_stat_into "$ji_pid" ji_st; then
    job_ref="{\"user\":null,\"uid\":null,\"pid\":$ji_pid,\"pids\":[$ji_pid],\"cmdline\":null,\"cwd\":null,\"start_ts\":null,\"elapsed_s\":null,\"slurm_job\":null,\"container\":null,\"rank\":null,\"local_rank\":null,\"visible\":false}"
    return 0
  fi
  local ji_top ji_p ji_pids='' ji_other_top
  jobinfo_top_into "$ji_pid" ji_top
  local -a ji_sorted=()
  for ji_p in "${!SMI_PIDS_MEM[@]}" "$ji_pid"; do
    jobinfo_top_into "$ji_p" ji_other_top
    [[ $ji_other_top == "$ji_top" ]] && ji_sorted[ji_p]=$ji_p
  done
  for ji_p in "${ji_sorted[@]}"; do ji_pids+="${ji_pids:+,}$ji_p"; done
  local ji_uid ji_user ji_cmd ji_cwd='' ji_container ji_start_ts=null ji_elapsed=null
  jobinfo_user_into "$ji_top" ji_uid ji_user
  local -a ji_args
  jobinfo_args_into "$ji_top" ji_args
  ((${#ji_args[@]})) || jobinfo_args_into "$ji_pid" ji_args
  ji_cmd=''
  ((${#ji_args[@]})) && jobinfo_mask_args_into ji_cmd "${ji_args[@]}"
  ji_cwd=$(readlink -- "/proc/$ji_top/cwd" 2>/dev/null) || ji_cwd=''
  jobinfo_container_into "$ji_pid" ji_container
  local -a ji_tst
  if jobinfo_stat_into "$ji_top" ji_tst && jobinfo_boot_time; then
    ji_start_ts=$((JOBINFO_BTIME + ji_tst[3] / JOBINFO_CLK_TCK))
    local ji_real_now
    printf -v ji_real_now '%(%s)T' -1
    ji_elapsed=$((ji_real_now - ji_start_ts))
    ((ji_elapsed >= 0)) || ji_elapsed=0
  fi
  local -A ji_env=()
  jobinfo_environ_into "$ji_pid" ji_env SLURM_JOB_ID RANK LOCAL_RANK SLURM_PROCID
  local ji_rank=${ji_env[RANK]:-${ji_env[SLURM_PROCID]:-}} ji_local_rank=${ji_env[LOCAL_RANK]:-}
  [[ $ji_rank =~ ^[0-9]+$ ]] || ji_rank=null
  [[ $ji_local_rank =~ ^[0-9]+$ ]] || ji_local_rank=null
  local ji_j_user ji_j_cmd ji_j_cwd ji_j_slurm ji_j_cont
  jobinfo_json_str_into "$ji_user" ji_j_user
  jobinfo_json_str_into "$ji_cmd" ji_j_cmd
  jobinfo_json_str_into "$ji_cwd" ji_j_cwd
  jobinfo_json_str_into "${ji_env[SLURM_JOB_ID]:-}" ji_j_slurm
  jobinfo_json_str_into "$ji_container" ji_j_cont
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  job_ref="{\"user\":$ji_j_user,\"uid\":${ji_uid:-null},\"pid\":$ji_top,\"pids\":[$ji_pids],\"cmdline\":$ji_j_cmd,\"cwd\":$ji_j_cwd,\"start_ts\":$ji_start_ts,\"elapsed_s\":$ji_elapsed,\"slurm_job\":$ji_j_slurm,\"container\":$ji_j_cont,\"rank\":$ji_rank,\"local_rank\":$ji_local_rank,\"visible\":true}"
}

# Reads the boot time and clock tick once (JOBINFO_BTIME, JOBINFO_CLK_TCK).
jobinfo_boot_time() {
  [[ -n ${JOBINFO_BTIME:-} ]] && return 0
  local key value
  while read -r key value; do
    if [[ $key == btime ]]; then
      JOBINFO_BTIME=$value
      break
    fi
  done 2>/dev/null </proc/stat || true
  [[ -n ${JOBINFO_BTIME:-} ]] || return 1
  JOBINFO_CLK_TCK=$(getconf CLK_TCK 2>/dev/null) || JOBINFO_CLK_TCK=100
  [[ $JOBINFO_CLK_TCK =~ ^[1-9][0-9]*$ ]] || JOBINFO_CLK_TCK=100
}

# Puts the user and the raw (unmasked) command lines of PID and of its job's
# top process into the variables named $2 ("NAME UID", either may be
# missing) and $3, for
# the per-job idle rules. Nothing of it is logged or sent.
jobinfo_match_text_into() {
  local pid=$1 top uid name
  local -n mt_user=$2 mt_cmd=$3
  local -a args
  jobinfo_top_into "$pid" top
  jobinfo_user_into "$pid" uid name
  # shellcheck disable=SC2034 # nameref: assigns the caller's variable
  mt_user="$name $uid"
  jobinfo_args_into "$pid" args
  mt_cmd="${args[*]}"
  if [[ $top != "$pid" ]]; then
    jobinfo_args_into "$top" args
    mt_cmd+=$'\n'"${args[*]}"
  fi
}

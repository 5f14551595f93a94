# vans_tf_config NUM_PS: exports TF_CONFIG for this task of a Slurm job step, as
# `vans-launch --tensorflow` lays a job out: the step's first NUM_PS tasks (by Slurm rank) are
# ps tasks 0..NUM_PS-1, the rest worker tasks (worker 0 the chief); each listens on its node
# at VANS_TF_PORT_BASE + its rank on that node (SLURM_LOCALID). The base defaults to
# 20000 + 32 * (job id % 399): each job gets its own block of 32 ports below the kernel's
# ephemeral range (32768 and up), room for 31 tasks of the job per node and the port above
# them that the vans scheduler takes; job ids 399 apart share a block. Ranks must be placed
# in blocks (srun's default `--distribution=block`): the cluster is read from
# SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE ("2(x3),1"), and a task whose own place
# (SLURMD_NODENAME, SLURM_LOCALID) is not where that puts it fails instead of joining a wrong
# cluster. POSIX sh, so it runs in srun's `/bin/sh -c`; vans-master's Slurm backend embeds
# this file. Its own variables start with `_vtc_`.
#
#   . deploy/slurm/tf-config.sh; vans_tf_config 2 && exec python train.py
vans_tf_config() {
    _vtc_ps_count=$1
    _vtc_base=${VANS_TF_PORT_BASE:-$((20000 + 32 * (SLURM_JOB_ID % 399)))}
    _vtc_hosts=$(scontrol show hostnames "$SLURM_STEP_NODELIST") || {
        echo "vans_tf_config: cannot list the step's nodes ($SLURM_STEP_NODELIST)" >&2
        return 1
    }
    _vtc_counts=
    for _vtc_part in $(echo "$SLURM_STEP_TASKS_PER_NODE" | tr ',' ' '); do
        case $_vtc_part in
            *"(x"*)
                _vtc_n=${_vtc_part%%"("*}
                _vtc_times=${_vtc_part#*"(x"}
                _vtc_times=${_vtc_times%")"}
                ;;
            *) _vtc_n=$_vtc_part; _vtc_times=1 ;;
        esac
        while [ "$_vtc_times" -gt 0 ]; do
            _vtc_counts="$_vtc_counts $_vtc_n"
            _vtc_times=$((_vtc_times - 1))
        done
    done
    _vtc_ps= _vtc_workers= _vtc_rank=0 _vtc_mine=
    set -- $_vtc_counts
    for _vtc_host in $_vtc_hosts; do
        if [ $# -eq 0 ]; then
            echo "vans_tf_config: SLURM_STEP_TASKS_PER_NODE ($SLURM_STEP_TASKS_PER_NODE) names fewer nodes than SLURM_STEP_NODELIST ($SLURM_STEP_NODELIST)" >&2
            return 1
        fi
        _vtc_local=0
        while [ "$_vtc_local" -lt "$1" ]; do
            _vtc_address="\"$_vtc_host:$((_vtc_base + _vtc_local))\""
            if [ "$_vtc_rank" -lt "$_vtc_ps_count" ]; then
                _vtc_ps="$_vtc_ps${_vtc_ps:+,}$_vtc_address"
            else
                _vtc_workers="$_vtc_workers${_vtc_workers:+,}$_vtc_address"
            fi
            if [ "$_vtc_rank" = "$SLURM_PROCID" ]; then
                _vtc_mine="$_vtc_host $_vtc_local"
            fi
            _vtc_rank=$((_vtc_rank + 1))
            _vtc_local=$((_vtc_local + 1))
        done
        shift
    done
    if [ "$_vtc_rank" -le "$_vtc_ps_count" ] || [ -z "$_vtc_mine" ]; then
        echo "vans_tf_config: $_vtc_rank tasks in the step, $_vtc_ps_count of them ps tasks, this one rank $SLURM_PROCID: no worker task, or not a task of the step" >&2
        return 1
    fi
    if [ -n "${SLURMD_NODENAME:-}" ] && [ "$_vtc_mine" != "$SLURMD_NODENAME ${SLURM_LOCALID:-?}" ]; then
        echo "vans_tf_config: rank $SLURM_PROCID runs on $SLURMD_NODENAME as local task ${SLURM_LOCALID:-?}, but a block placement puts it at $_vtc_mine (run srun with --distribution=block)" >&2
        return 1
    fi
    if [ "$SLURM_PROCID" -lt "$_vtc_ps_count" ]; then
        _vtc_type=ps _vtc_index=$SLURM_PROCID
    else
        _vtc_type=worker _vtc_index=$((SLURM_PROCID - _vtc_ps_count))
    fi
    _vtc_cluster="\"worker\":[$_vtc_workers]"
    if [ -n "$_vtc_ps" ]; then
        _vtc_cluster="\"ps\":[$_vtc_ps],$_vtc_cluster"
    fi
    TF_CONFIG="{\"cluster\":{$_vtc_cluster},\"task\":{\"type\":\"$_vtc_type\",\"index\":$_vtc_index}}"
    export TF_CONFIG
}

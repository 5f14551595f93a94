# vans_tf_config NUM_PS: exports TF_CONFIG for this task of a Slurm job step, as
# `vans-launch --tensorflow` and TensorFlow's SlurmClusterResolver lay a job out: the step's
# first NUM_PS tasks (by Slurm rank) are ps tasks 0..NUM_PS-1, the rest worker tasks (worker 0
# the chief); each listens on its node at VANS_TF_PORT_BASE + its rank on that node
# (SLURM_LOCALID; the base defaults to 20000 + job id % 20000, so two jobs on a node do not
# collide). Ranks are placed in blocks (srun's default `--distribution=block`), which is how
# the cluster is read from SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE ("2(x3),1").
# POSIX sh, so it runs in srun's `/bin/sh -c`; vans-master's Slurm backend embeds this file.
#
#   . deploy/slurm/tf-config.sh; vans_tf_config 2 && exec python train.py
vans_tf_config() {
    num_ps=$1
    base=${VANS_TF_PORT_BASE:-$((20000 + SLURM_JOB_ID % 20000))}
    hosts=$(scontrol show hostnames "$SLURM_STEP_NODELIST") || {
        echo "vans_tf_config: cannot list the step's nodes ($SLURM_STEP_NODELIST)" >&2
        return 1
    }
    counts=
    for part in $(echo "$SLURM_STEP_TASKS_PER_NODE" | tr ',' ' '); do
        case $part in
            *"(x"*) n=${part%%"("*}; times=${part#*"(x"}; times=${times%")"} ;;
            *) n=$part; times=1 ;;
        esac
        while [ "$times" -gt 0 ]; do
            counts="$counts $n"
            times=$((times - 1))
        done
    done
    ps= workers= rank=0
    set -- $counts
    for host in $hosts; do
        if [ $# -eq 0 ]; then
            echo "vans_tf_config: SLURM_STEP_TASKS_PER_NODE ($SLURM_STEP_TASKS_PER_NODE) names fewer nodes than SLURM_STEP_NODELIST ($SLURM_STEP_NODELIST)" >&2
            return 1
        fi
        local_rank=0
        while [ "$local_rank" -lt "$1" ]; do
            address="\"$host:$((base + local_rank))\""
            if [ "$rank" -lt "$num_ps" ]; then
                ps="$ps${ps:+,}$address"
            else
                workers="$workers${workers:+,}$address"
            fi
            rank=$((rank + 1))
            local_rank=$((local_rank + 1))
        done
        shift
    done
    if [ "$rank" -le "$num_ps" ] || [ "$SLURM_PROCID" -ge "$rank" ]; then
        echo "vans_tf_config: $rank tasks in the step, $num_ps of them ps tasks, this one rank $SLURM_PROCID: no worker task, or not a task of the step" >&2
        return 1
    fi
    if [ "$SLURM_PROCID" -lt "$num_ps" ]; then
        type=ps index=$SLURM_PROCID
    else
        type=worker index=$((SLURM_PROCID - num_ps))
    fi
    cluster="\"worker\":[$workers]"
    if [ -n "$ps" ]; then
        cluster="\"ps\":[$ps],$cluster"
    fi
    TF_CONFIG="{\"cluster\":{$cluster},\"task\":{\"type\":\"$type\",\"index\":$index}}"
    export TF_CONFIG
}

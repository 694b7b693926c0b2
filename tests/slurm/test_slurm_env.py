"""SlurmEnv against environment dumps: 22.05 as measured here, 23.02/23.11/24.05 as their docs describe.

22.05 dumps are trimmed copies of what tasks printed on the local cluster (het job of 3 groups:
gpu1 | gpu2 | cpu[1-2]). The 23.x/24.x dumps follow the sbatch/srun man pages of those releases
("OUTPUT ENVIRONMENT VARIABLES" and the heterogeneous_jobs page): the ``*_PACK_*`` twins are gone
(removed in 23.02), ``SLURM_JOB_START_TIME``/``SLURM_JOB_END_TIME`` are exported, and the het
group variables keep their ``_HET_GROUP_k`` names.
"""

from __future__ import annotations

import pytest

from hpc.slurm_env import SlurmEnv, expand_hostlist, parse_slurm_duration

_HET_ALLOC = {  # what every task of the 3-group job inherits from the batch environment
    "SLURM_HET_SIZE": "3",
    "SLURM_JOB_ID_HET_GROUP_0": "41", "SLURM_JOB_ID_HET_GROUP_1": "42", "SLURM_JOB_ID_HET_GROUP_2": "43",
    "SLURM_JOB_NODELIST_HET_GROUP_0": "gpu1", "SLURM_JOB_NODELIST_HET_GROUP_1": "gpu2",
    "SLURM_JOB_NODELIST_HET_GROUP_2": "cpu[1-2]",
    "SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "2", "SLURM_NTASKS_HET_GROUP_2": "2",
}
_PACK_TWINS = {k.replace("HET_GROUP", "PACK_GROUP").replace("HET_SIZE", "PACK_SIZE"): v for k, v in _HET_ALLOC.items()}

# 22.05, measured: `srun --het-group=1 --ntasks=2` task 1 on gpu2. SLURM_JOB_ID is the LEADER's id
# and SLURM_JOB_NODELIST the group's node: nothing names the group directly.
SLURM_22_05_GROUP1_STEP = {
    **_HET_ALLOC, **_PACK_TWINS,
    "SLURM_JOB_ID": "41", "SLURM_JOBID": "41", "SLURM_JOB_NODELIST": "gpu2", "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURMD_NODENAME": "gpu2", "SLURM_JOB_PARTITION": "gpu",
}
# 22.05, measured: the batch shell (on group 0's first node); not a step.
SLURM_22_05_BATCH = {
    **_HET_ALLOC, **_PACK_TWINS,
    "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "gpu1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
    "SLURMD_NODENAME": "gpu1", "SLURM_RESTART_COUNT": "2",
}
# 23.02 (man srun): `srun --het-group=0,1,2` spans every group: SLURM_PROCID runs 0..4 over the
# groups; SLURM_NTASKS=5; SLURM_JOB_NODELIST is the union. Task 3 = group 2, rank 0 (cpu1).
SLURM_23_02_ALL_GROUPS = {
    **_HET_ALLOC,
    "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "cpu[1-2],gpu[1-2]", "SLURM_NTASKS": "5",
    "SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "cpu1",
    "SLURM_JOB_START_TIME": "1760000000", "SLURM_JOB_END_TIME": "1760003600",
}
# 23.11 (man srun), same spanning step but the node name withheld (some sites scrub SLURMD_*):
# the group must come from SLURM_PROCID alone. Task 2 = group 1, rank 1.
SLURM_23_11_ALL_GROUPS_NO_NODENAME = {
    **_HET_ALLOC,
    "SLURM_JOB_ID": "41", "SLURM_NTASKS": "5", "SLURM_PROCID": "2", "SLURM_STEP_ID": "0",
    "SLURM_JOB_END_TIME": "1760003600",
}
# 24.05 (man sbatch/srun): a plain (non-het) job, 2 nodes x 4 tasks, task 6; requeued once.
SLURM_24_05_PLAIN = {
    "SLURM_JOB_ID": "977", "SLURM_JOB_NODELIST": "node[007-008]", "SLURM_NTASKS": "8", "SLURM_PROCID": "6",
    "SLURM_LOCALID": "2", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "node008", "SLURM_RESTART_COUNT": "1",
    "SLURM_JOB_START_TIME": "1760000000", "SLURM_JOB_END_TIME": "1760007200", "SLURM_CPUS_PER_TASK": "4",
}
# 24.05: a single-group step of group 2 of a het job on two nodes, task 1 on cpu2.
SLURM_24_05_GROUP2_STEP = {
    **_HET_ALLOC,
    "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "cpu[1-2]", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "1", "SLURMD_NODENAME": "cpu2", "SLURM_JOB_END_TIME": "1760003600",
}


@pytest.mark.parametrize(("env", "group", "rank", "size"), [
    (SLURM_22_05_GROUP1_STEP, 1, 1, 2),
    (SLURM_22_05_BATCH, 0, 0, 1),
    (SLURM_23_02_ALL_GROUPS, 2, 0, 2),
    (SLURM_23_11_ALL_GROUPS_NO_NODENAME, 1, 1, 2),
    (SLURM_24_05_PLAIN, 0, 6, 8),
    (SLURM_24_05_GROUP2_STEP, 2, 1, 2),
], ids=["22.05-group1-step", "22.05-batch", "23.02-spanning", "23.11-spanning-no-nodename", "24.05-plain",
        "24.05-group2-step"])
def test_group_and_rank(env: dict[str, str], group: int, rank: int, size: int) -> None:
    s = SlurmEnv.from_environ(env)
    assert (s.het_group, s.group_rank, s.group_size) == (group, rank, size)


def test_het_job_identity_and_node_lists() -> None:
    s = SlurmEnv.from_environ(SLURM_22_05_GROUP1_STEP)
    assert s.in_slurm and s.in_step
    assert s.job_id == "41"
    assert s.num_het_groups == 3
    assert [s.group_nodes(k) for k in range(3)] == [["gpu1"], ["gpu2"], ["cpu1", "cpu2"]]
    assert s.local_rank == 1


def test_old_pack_names_alone_are_enough() -> None:
    env = {k: v for k, v in SLURM_22_05_GROUP1_STEP.items() if "HET_" not in k}
    s = SlurmEnv.from_environ(env)
    assert (s.num_het_groups, s.het_group, s.group_nodes(2)) == (3, 1, ["cpu1", "cpu2"])


def test_plain_job_and_restart_count() -> None:
    s = SlurmEnv.from_environ(SLURM_24_05_PLAIN)
    assert s.num_het_groups == 1
    assert s.group_nodes(0) == ["node007", "node008"]
    assert s.restart_count == 1
    assert SlurmEnv.from_environ(SLURM_22_05_BATCH).restart_count == 2
    assert not SlurmEnv.from_environ(SLURM_22_05_BATCH).in_step


def test_outside_slurm() -> None:
    s = SlurmEnv.from_environ({"HOME": "/root", "PATH": "/bin"})
    assert not s.in_slurm
    assert (s.job_id, s.het_group, s.group_rank, s.restart_count) == ("", 0, 0, 0)
    assert s.remaining_s(squeue=False) is None
    assert s.env == {}  # only SLURM_* / SLURMD_* are kept


def test_remaining_time_from_end_time() -> None:
    s = SlurmEnv.from_environ(SLURM_23_02_ALL_GROUPS)
    assert s.remaining_s(now=1760003000) == 600
    assert s.remaining_s(now=1760009999) == 0  # past the limit: never negative


def test_remaining_time_falls_back_to_squeue_only_when_allowed() -> None:
    s = SlurmEnv.from_environ(SLURM_22_05_BATCH)  # 22.05 exports no SLURM_JOB_END_TIME
    assert s.end_time(squeue=False) is None


def test_rendezvous_is_first_train_node_and_moves_with_restarts() -> None:
    host, port = SlurmEnv.from_environ(SLURM_23_02_ALL_GROUPS).rendezvous(0)
    assert host == "gpu1"
    assert 20000 <= port < 40000
    first = SlurmEnv.from_environ({**SLURM_24_05_PLAIN, "SLURM_RESTART_COUNT": "0"}).rendezvous()
    second = SlurmEnv.from_environ({**SLURM_24_05_PLAIN, "SLURM_RESTART_COUNT": "1"}).rendezvous()
    assert first[0] == second[0] == "node007"
    assert first[1] != second[1]
    # every task of the job computes the same answer, whichever group it is in
    assert SlurmEnv.from_environ(SLURM_24_05_GROUP2_STEP).rendezvous(0) == (host, port)


@pytest.mark.parametrize(("hostlist", "hosts"), [
    ("cpu1", ["cpu1"]),
    ("cpu[1-2],gpu1", ["cpu1", "cpu2", "gpu1"]),
    ("node[007-009,12]", ["node007", "node008", "node009", "node12"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("a[1],b", ["a1", "b"]),
    ("", []),
])
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(("text", "seconds"), [
    ("1-02:03:04", 93784.0), ("02:03:04", 7384.0), ("03:04", 184.0), ("59", 59.0),
    ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("", None),
])
def test_parse_slurm_duration(text: str, seconds: float | None) -> None:
    assert parse_slurm_duration(text) == seconds


def test_distributed_env() -> None:
    env = {**SLURM_24_05_PLAIN, "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
    d = SlurmEnv.from_environ(env).distributed_env()
    assert (d["MASTER_ADDR"], d["RANK"], d["WORLD_SIZE"], d["LOCAL_RANK"], d["LOCAL_WORLD_SIZE"]) == (
        "node007", "6", "8", "2", "4")
    assert d["MASTER_PORT"] == str(SlurmEnv.from_environ(env).rendezvous()[1])

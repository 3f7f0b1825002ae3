"""Break the library on purpose, one promise at a time, and check that its tests notice.

Each mutation replaces one exact piece of library code (found exactly once) with a small,
realistic bug, runs the tests said to cover the promise, and restores the file with
``git checkout -- FILE`` whatever happens. A mutation is *caught* when pytest fails (exit
code 1). The results are what docs/audit.md tabulates.

    python tools/audit_mutations.py --list
    python tools/audit_mutations.py --check         # every mutation still applies (seconds; what CI runs)
    python tools/audit_mutations.py                 # all, one after another (minutes)
    python tools/audit_mutations.py M07 M09         # some

Before anything is mutated, every chosen mutation is checked against the current source: its
code must occur exactly once in its file and its tests must exist. One that does not (the code
moved) fails the run, exit 2, naming it: it must be re-keyed, never reported as caught.
Run it in a clean work tree: it refuses a mutation whose file has uncommitted changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutation", "MUTATIONS", "problems", "run", "main"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    id: str
    promise: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""
    """Why the mutation cannot be caught (it changes nothing observable); empty for a real one."""


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M(
        "M01",
        "exactly once per epoch without drop_last: a rank's slice is rounded up",
        "reader/plan/assign.py",
        "return total // world if drop_last else -(-total // world)",
        "return total // world",
        ("tests/reader/plan/test_assign.py::test_exactly_once_equal_batches_over_many_worlds",),
    ),
    M(
        "M02",
        "drop_last=False keeps the last partial batch",
        "reader/plan/assign.py",
        "return per // batch_size if drop_last else -(-per // batch_size)",
        "return per // batch_size",
        ("tests/reader/plan/test_assign.py::test_exactly_once_equal_batches_over_many_worlds",),
    ),
    M(
        "M03",
        "shard assignment: rank r starts at r * per (off by one)",
        "reader/plan/assign.py",
        "    base = rank * per\n",
        "    base = rank * per + (1 if rank else 0)\n",
        ("tests/reader/plan/test_assign.py::test_exactly_once_equal_batches_over_many_worlds",),
    ),
    M(
        "M04",
        "a new shard order each epoch (epoch seed not reused)",
        "reader/plan/shuffle.py",
        'derive_seed("shards", seed, epoch)',
        'derive_seed("shards", seed, 0)',
        (
            "tests/reader/plan/test_assign.py::test_deterministic_and_new_order_each_epoch",
            "tests/audit/test_promises_reader.py",
        ),
    ),
    M(
        "M05",
        "a new block order each epoch (epoch seed not reused)",
        "reader/plan/mix.py",
        'derive_seed("blocks", seed, epoch)',
        'derive_seed("blocks", seed, 0)',
        (
            "tests/reader/plan/test_assign.py::test_deterministic_and_new_order_each_epoch",
            "tests/audit/test_promises_reader.py",
        ),
    ),
    M(
        "M06",
        "augmentation drawn anew each epoch",
        "reader/plan/shuffle.py",
        'derive_seed("sample", seed, epoch, key)',
        'derive_seed("sample", seed, 0, key)',
        ("tests/reader/test_dataset.py::test_one_and_two_workers_augment_a_key_identically",),
    ),
    M(
        "M07",
        "augmentation identical whatever the workers (seeded by seed, epoch, key only)",
        "reader/sample/processor.py",
        "return sample_rng(self._seed, self._epoch, sample_id)",
        'return sample_rng(self._seed, self._epoch, f"{os.getpid()}/{sample_id}")',
        ("tests/reader/test_dataset.py::test_one_and_two_workers_augment_a_key_identically",),
    ),
    M(
        "M08",
        "verify=True: a shard whose SHA-256 differs from the index fails",
        "reader/io/shardfile.py",
        "            if found == expected\n",
        "            if found or expected\n",
        (
            "tests/reader/test_untrusted.py::test_tampered_shard_reads_silently_without_verify_and_fails_with_it",
            "tests/reader/io/test_checksums.py::test_user_checksums_pass_intact_shards_and_catch_a_tampered_one",
        ),
    ),
    M(
        "M09",
        "remote shards are checked against the manifest's SHA-256 as they are fetched",
        "shardify/remote.py",
        "if self.hasher is not None and self.hasher.hexdigest() != self.want_sha:",
        "if False:",
        (
            "tests/reader/io/test_remote.py::test_corrupt_copy_on_the_server_fails_the_checksum",
            "tests/reader/io/test_checksums.py::test_a_shard_list_over_http_is_checked_against_a_sidecar_over_http",
        ),
    ),
    M(
        "M10",
        "`shardify verify` finds a checksum mismatch (exit 3)",
        "convert/verify.py",
        "if entry.sha256 and reader.hash.hexdigest() != entry.sha256:",
        "if False:",
        (
            "tests/reader/test_untrusted.py::test_shardify_verify_finds_the_same_tampering",
            "tests/convert/test_cli.py::test_exit_codes_info_and_verify",
            "tests/convert/test_cli.py::test_verify_finds_truncation_count_and_stray_shards",
        ),
    ),
    M(
        "M11",
        "every shard is fsynced before its rename",
        "convert/write/outfs.py",
        "        if fsync:\n            os.fsync(f.fileno())\n\n    def replace",
        "        if fsync:\n            pass\n\n    def replace",
        (
            "tests/convert/write/test_gather.py::test_each_shard_is_fsynced_before_its_rename_and_the_manifest_comes_last",
        ),
    ),
    M(
        "M12",
        "a shard is renamed into place only when whole and fsynced",
        "convert/write/shardstream.py",
        "            self.fs.finish_write(f, fsync=self.fsync)\n            f.close()\n"
        "            if self.before_rename is not None:\n"
        "                self.before_rename(self.index, out.size, out.hash.hexdigest())\n"
        "            self.fs.replace(tmp, final)\n",
        "            f.flush()\n            self.fs.replace(tmp, final)\n"
        "            self.fs.finish_write(f, fsync=self.fsync)\n            f.close()\n"
        "            if self.before_rename is not None:\n"
        "                self.before_rename(self.index, out.size, out.hash.hexdigest())\n",
        (
            "tests/convert/write/test_gather.py::test_each_shard_is_fsynced_before_its_rename_and_the_manifest_comes_last",
        ),
    ),
    M(
        "M13",
        "the split index is written durably before the manifest that names it",
        "convert/write/finish.py",
        "    fs.write_atomic(index_name(split, version), json_bytes(index.to_json()))\n    return index\n",
        "    fs.write_atomic(index_name(split, version), json_bytes(index.to_json()), durable=False)\n"
        "    return index\n",
        (
            "tests/convert/write/test_gather.py::test_each_shard_is_fsynced_before_its_rename_and_the_manifest_comes_last",
            "tests/audit/test_promises_convert.py",
        ),
    ),
    M(
        "M14",
        "bad input is never dropped silently: skipped inputs are in the report",
        "convert/write/finish.py",
        "        for p in skipped + ignored\n",
        "        for p in ignored\n",
        (
            "tests/convert/inputs/test_inputs.py::test_bad_images_are_skipped_and_reported",
            "tests/convert/inputs/test_inputs.py::test_full_check_catches_what_the_header_check_cannot",
        ),
    ),
    M(
        "M15",
        "bad input found while writing a shard is reported (not swallowed)",
        "convert/write/shards.py",
        "stream.skip(Ignored(e.path or sample.spec.identity, e.reason))",
        "pass",
        (
            "tests/convert/inputs/test_inputs.py::test_bad_images_are_skipped_and_reported",
            "tests/convert/inputs/test_inputs.py::test_full_check_catches_what_the_header_check_cannot",
        ),
    ),
    M(
        "M16",
        "CLI: exit code 3 when inputs were skipped",
        "cli/convert.py",
        "return EXIT_SKIPPED if result.num_skipped else EXIT_OK",
        "return EXIT_OK",
        ("tests/convert/test_cli.py::test_exit_codes_info_and_verify",),
    ),
    M(
        "M17",
        "CLI: `shardify verify` exits 3 when it finds problems",
        "cli/inspect.py",
        "return EXIT_OK if report.ok else EXIT_SKIPPED",
        "return EXIT_OK",
        (
            "tests/convert/test_cli.py::test_exit_codes_info_and_verify",
            "tests/reader/test_untrusted.py::test_shardify_verify_finds_the_same_tampering",
        ),
    ),
    M(
        "M18",
        "byte-identical conversion: fixed tar header fields (mtime 0)",
        "shardify/tarfmt.py",
        '_HEADER_TEMPLATE[136:148] = b"%011o\\x00" % MTIME',
        '_HEADER_TEMPLATE[136:148] = b"%011o\\x00" % int(__import__("time").time())',
        (
            "tests/convert/test_roundtrip.py::test_same_output_whatever_the_workers",
            "tests/format/test_format.py::test_header_is_what_tarfile_writes_with_fixed_fields",
        ),
    ),
    M(
        "M19",
        "mixing: largest-remainder counts of each stream",
        "reader/plan/mix.py",
        "key=lambda i: (-(exact[i] - counts[i]), i)",
        "key=lambda i: (exact[i] - counts[i], i)",
        ("tests/reader/plan/test_mix.py::test_stream_counts",),
    ),
    M(
        "M20",
        "resume on another topology: padding repeats do not count as consumed",
        "reader/plan/resume.py",
        "                if where[p] < total:  # a padding repeat read early leaves its sample to be read\n"
        "                    mask[where[p]] = 1\n",
        "                mask[where[p] % total] = 1\n",
        ("tests/reader/plan/test_resume_topology.py",),
    ),
    M(
        "M21",
        "resume on the same topology: DataLoader worker w plays plan worker (w + consumed) % workers",
        "reader/plan/assign.py",
        "role = (worker + consumed) % workers",
        "role = worker",
        ("tests/reader/test_resume_exact.py::test_resume_equals_the_uninterrupted_run",),
    ),
    M(
        "M22",
        "a state of an earlier (unreleased) version is refused naming the version found and wanted",
        "reader/delivery/state.py",
        "    if version != STATE_VERSION or isinstance(version, bool):",
        "    if version not in (1, 2, STATE_VERSION) or isinstance(version, bool):",
        ("tests/reader/delivery/test_state.py::test_a_state_of_an_earlier_version_is_refused_naming_both_versions",),
    ),
    M(
        "M23",
        "tar members named with '..' are refused",
        "shardify/tarheader.py",
        'if ".." in parts:',
        "if False:",
        ("tests/format/test_tario_fuzz.py::test_each_hostile_member_gives_a_clear_error",),
    ),
    M(
        "M24",
        "pickle fields are never unpickled without allow_pickle=True",
        "reader/sample/decode.py",
        "    if not allow_pickle:\n        raise PickleRefusedError(",
        "    if False:\n        raise PickleRefusedError(",
        ("tests/reader/test_untrusted.py::test_malicious_pickle_never_runs_when_read_with_workers",),
    ),
    M(
        "M25",
        "an exception in a user transform reaches the trainer (never swallowed)",
        "reader/sample/processor.py",
        "if not self._skip or isinstance(e, self._refused):",
        "if isinstance(e, self._refused):",
        ("tests/reader/test_faults.py::test_transform_error_reaches_the_trainer_with_shard_key_and_cause",),
    ),
    M(
        "M26",
        "--raw-pixels never enlarges an image",
        "shardify/pixels.py",
        "    if bound <= size:\n        return width, height",
        "    if bound == size:\n        return width, height",
        ("tests/format/test_pixels.py",),
    ),
    M(
        "M27",
        "device decode: workers draw the flip exactly as the CPU path does",
        "reader/sample/device_prep.py",
        "            if rng.random() < p:",
        "            if rng.random() > p:",
        ("tests/reader/sample/test_device_decode.py::test_same_crop_boxes_and_flips_as_the_cpu_path",),
    ),
    M(
        "M28",
        "resume of a conversion rewrites a damaged finished shard",
        "convert/write/session.py",
        "        return file_sha256(f) == result.sha256",
        "        return True",
        ("tests/convert/write/test_resume.py::test_damaged_finished_shard_is_rewritten_on_resume",),
    ),
    M(
        "M29",
        "a finished split is not replaced without --overwrite",
        "convert/write/session.py",
        "if finished and not overwrite:",
        "if False:",
        ("tests/convert/write/test_resume.py::test_finished_output_is_not_overwritten_without_flag",),
    ),
    M(
        "M30",
        "the converter's sample order is a seeded shuffle (--seed)",
        "convert/write/plan.py",
        "order = plan_order(len(specs), seed=options.seed,",
        "order = plan_order(len(specs), seed=0,",
        ("tests/convert/test_roundtrip.py::test_seed_changes_order_no_shuffle_keeps_it",),
    ),
    M(
        "M31",
        "shards are standard tar files ending with two zero blocks (tar/webdataset/wids read them)",
        "convert/write/shardstream.py",
        "            out.write(END_OF_ARCHIVE)\n            self.fs.finish_write",
        "            self.fs.finish_write",
        ("tests/convert/test_roundtrip.py::test_other_tools_read_the_shards", "tests/audit/test_promises_convert.py"),
    ),
    M(
        "M32",
        "mark_repeats: __valid__ is False exactly for padding repeats",
        "reader/streams.py",
        'item["__valid__"] = p not in repeats',
        'item["__valid__"] = True',
        ("tests/reader/test_streams.py::test_mark_repeats_counts_every_sample_once_over_ranks",),
    ),
    M(
        "M33",
        "two conversions cannot write one folder at once (a lock)",
        "convert/write/outfs.py",
        "                fcntl.flock(self.f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "                pass",
        ("tests/convert/pyapi/test_pywriter.py",),
    ),
    M(
        "M34",
        "a chunked shard whose keys member is not its chunk's is damage",
        "reader/io/chunked.py",
        "            if chunk.keys[0] != key:",
        "            if False:",
        (
            "tests/reader/io/test_chunked.py::test_a_chunk_whose_keys_are_not_its_own_is_damage",
            "tests/audit/test_promises_reader.py",
        ),
    ),
    M(
        "M35",
        "ShardedDataset refuses an unfinished folder, saying to run the conversion again",
        "reader/io/indexsource.py",
        "        if unfinished is not None:\n            raise unfinished from e",
        "        if False:\n            raise unfinished from e",
        ("tests/convert/pyapi/test_pykill.py",),
    ),
    M(
        "M36",
        "readers refuse a format_version newer than theirs, naming the file",
        "shardify/splitindex.py",
        "    if version < 1 or version > READ_VERSION:",
        "    if version < 1:",
        (
            "tests/format/test_format.py::test_bad_index_names_the_field_and_file",
            "tests/format/test_chunk.py::test_a_reader_of_formats_1_to_2_refuses_a_chunked_split_by_name",
        ),
    ),
    M(
        "M37",
        "the index the manifest names must carry the manifest's version (loading checks it)",
        "shardify/manifest.py",
        "        if index.version != ref.version:",
        "        if False:",
        ("tests/format/test_format.py", "tests/convert/write/test_versions.py", "tests/audit/test_promises_format.py"),
    ),
    M(
        "M38",
        "ShardWriter/convert_items: every shard is fsynced before its rename",
        "convert/write/shardstream.py",
        "            self.fs.finish_write(f, fsync=self.fsync)\n            f.close()",
        "            f.flush()\n            f.close()",
        (
            "tests/convert/write/test_gather.py",
            "tests/convert/pyapi/test_pywriter.py",
            "tests/convert/pyapi/test_fromitems.py",
            "tests/audit/test_promises_convert.py",
        ),
    ),
    M(
        "M39",
        "the shards' renames are made durable (folder fsynced) before the manifest is written",
        "convert/write/outfs.py",
        "        try:\n            os.fsync(fd)\n        finally:\n            os.close(fd)",
        "        try:\n            pass\n        finally:\n            os.close(fd)",
        (
            "tests/convert/write/test_gather.py",
            "tests/convert/write/test_resume.py",
            "tests/audit/test_promises_convert.py",
        ),
    ),
    M(
        "M40",
        "under on_error='skip' every rank keeps its batch count (a batch with no good sample borrows)",
        "reader/stages/batch.py",
        "        if good is None:\n            self._held.append(items)\n            return",
        "        if good is None:\n            return",
        (
            "tests/reader/test_errors.py::test_a_batch_with_no_good_sample_borrows_from_the_next",
            "tests/reader/test_errors.py::test_skip_counts_reports_and_keeps_batch_counts_equal",
        ),
    ),
    M(
        "M41",
        "verify=True hashes each shard once per process",
        "reader/io/shardfile.py",
        "        if known is not None and known[0] == stamp:",
        "        if False:",
        ("tests/reader/test_untrusted.py::test_verify_passes_and_hashes_each_shard_once_per_process",),
    ),
    M(
        "M42",
        "a member over max_member_bytes makes the shard damaged before it is read",
        "shardify/tarheader.py",
        "    if size > max_member:",
        "    if False:",
        (
            "tests/reader/test_caps.py::test_a_member_over_max_member_bytes_is_refused_before_it_is_read",
            "tests/reader/test_fuzz.py::test_member_declaring_8_gib_is_refused_before_reading",
        ),
    ),
    M(
        "M43",
        "an image over PIL.Image.MAX_IMAGE_PIXELS is refused before decoding",
        "reader/sample/decode.py",
        "    if limit is None or width * height <= limit:",
        "    if True:",
        ("tests/reader/test_caps.py::test_an_image_over_the_pixel_limit_is_refused_before_it_is_decoded",),
    ),
    M(
        "M44",
        "a key met again after other keys (duplicate) is an error",
        "shardify/tarmembers.py",
        "                if key in seen\n                else None\n",
        "                if False\n                else None\n",
        ("tests/format/test_tario_fuzz.py::test_each_hostile_member_gives_a_clear_error",),
    ),
    M(
        "M45",
        "a loader state whose field was edited is refused naming the field",
        "reader/delivery/state.py",
        "        if found != check[name]:",
        "        if found is None:",
        ("tests/reader/delivery/test_state.py::test_an_edited_or_incomplete_state_is_refused_naming_the_field",),
    ),
    M(
        "M46",
        "a loader state saved with other options is refused naming the option",
        "reader/delivery/state.py",
        "        if saved.get(name) != value:",
        "        if name not in saved:",
        ("tests/reader/delivery/test_state.py::test_a_state_of_other_options_is_refused_naming_the_option",),
    ),
    M(
        "M47",
        "symbolic links are followed only inside the source root (prefix bug: /src2 is not inside /src)",
        "convert/inputs/imagefolder.py",
        "    return real == real_root or real.startswith(real_root + os.sep)",
        "    return real == real_root or real.startswith(real_root)",
        (
            "tests/convert/inputs/test_hostile.py::test_symlinks_followed_inside_the_root_only_and_loops_end",
            "tests/audit/test_promises_convert.py",
        ),
    ),
    M(
        "M48",
        "a label out of range (--num-classes) is skipped and reported (off by one)",
        "convert/inputs/labels.py",
        "value >= self.num_classes",
        "value > self.num_classes",
        (
            "tests/convert/inputs/test_inputs.py::test_ids_missing_label_unknown_id_and_out_of_range",
            "tests/audit/test_promises_convert.py",
        ),
    ),
    M(
        "M49",
        "shuffle=False keeps whole shards in order",
        "reader/plan/shuffle.py",
        '    if shuffle:\n        random.Random(derive_seed("shards"',
        '    if True:\n        random.Random(derive_seed("shards"',
        (
            "tests/reader/plan/test_assign.py::test_unshuffled_and_legacy_sequences_are_whole_shards_in_order",
            "tests/reader/test_dataset.py::test_zero_and_two_workers_give_the_same_samples",
        ),
    ),
    M(
        "M50",
        "a reader whose version was removed raises DatasetVersionError naming both versions",
        "reader/io/source.py",
        "        if now == self.version:\n            return None",
        "        if True:\n            return None",
        ("tests/convert/write/test_versions.py::test_reconversion_between_epochs_never_mixes_versions",),
    ),
    M(
        "M51",
        "a rewritten key gets a hash of the original name appended (keys stay unique)",
        "shardify/keys.py",
        "    if rewritten:\n        safe = _with_hash(",
        "    if False:\n        safe = _with_hash(",
        ("tests/format/test_format.py",),
    ),
    M(
        "M52",
        "device decode: only baseline 8-bit 3-component JPEGs go to the device",
        "reader/sample/device_prep.py",
        "frame.sof not in (0, 1) or",
        "frame.sof not in (0, 1, 2) or",
        ("tests/reader/sample/test_device_decode.py::test_jpeg_header_decides_what_goes_to_the_device",),
    ),
    M(
        "M53",
        "a worker killed mid-epoch raises WorkerError naming it (never a hang, never a bare error)",
        "reader/delivery/loader.py",
        "            if died is not None:\n                raise WorkerError(",
        "            if False:\n                raise WorkerError(",
        (
            "tests/reader/test_faults.py::test_killed_worker_gives_a_clear_error_then_resumes_exactly",
            "tests/audit/test_promises_reader.py",
        ),
    ),
    M(
        "M54",
        "leaving the loop early stops per-epoch workers at once",
        "reader/delivery/loader.py",
        '            if workers is not None and workers is not getattr(self.dataloader, "_iterator", None):\n'
        "                self._shut_down(workers)",
        '            if workers is not None and workers is not getattr(self.dataloader, "_iterator", None):\n'
        "                pass",
        (
            "tests/reader/test_faults.py::test_break_stops_per_epoch_workers_at_once",
            "tests/reader/test_faults.py::test_repeated_early_exits_do_not_accumulate",
        ),
        "under CPython the loop's `break` drops the last reference to the generator, whose frame holds the "
        "only reference to torch's worker iterator, and that iterator shuts its workers down when freed",
    ),
    M(
        "M55",
        "keys hold no '.' (webdataset and wids split member names at the first dot)",
        "shardify/keys.py",
        '_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")',
        '_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")',
        ("tests/format/test_format.py",),
    ),
    M(
        "M56",
        "hidden files are skipped and counted",
        "convert/inputs/imagefolder.py",
        '                problems.append(Ignored(os.path.join(rel_folder, entry.name), "hidden", "ignored"))',
        "                pass",
        ("tests/convert/inputs/test_inputs.py::test_tricky_tree_class_mapping",),
    ),
    M(
        "M57",
        "an image file over --max-image-bytes is reported as too large, unread",
        "convert/write/readsample.py",
        "        if limit is not None and size > limit:",
        "        if False:",
        ("tests/convert/inputs/test_hostile.py::test_a_big_junk_file_costs_bounded_memory_and_time",),
    ),
    M(
        "M58",
        ".npy object arrays are never unpickled without allow_pickle=True",
        "shardify/npy.py",
        "        if not allow_pickle:\n            raise ObjectArrayError(",
        "        if False:\n            raise ObjectArrayError(",
        (
            "tests/reader/test_untrusted.py::test_malicious_pickle_never_runs_when_read_with_workers",
            "tests/format/test_npy.py",
        ),
    ),
    M(
        "M59",
        ".pt/.pth load only with torch.load(weights_only=True)",
        "reader/sample/decode.py",
        "weights_only=not allow_pickle",
        "weights_only=False",
        ("tests/reader/test_untrusted.py::test_malicious_pickle_never_runs_when_read_with_workers",),
    ),
    M(
        "M60",
        "the shuffle buffer ramps up: a first batch waits for buffer // 16 reads, not the whole buffer",
        "reader/plan/shuffle.py",
        "    return max(1, min(RAMP_START, buffer_size // 16))",
        "    return max(1, buffer_size)",
        ("tests/reader/plan/test_shuffle.py::test_the_first_batch_waits_for_the_ramp_not_the_whole_buffer",),
    ),
    M(
        "M61",
        "convert_items: an item whose fn raises is reported with its index (never dropped)",
        "convert/pyapi/fromitems.py",
        '            stream.skip(Ignored(f"{noun} {index}: {item_repr(item)}", reason))',
        "            pass",
        ("tests/convert/pyapi/test_fromitems.py::test_a_failing_fn_is_reported_with_index_repr_and_error",),
    ),
    M(
        "M62",
        "samples_per_epoch: consecutive epochs use every sample once before any twice",
        "reader/plan/mix.py",
        'seed=derive_seed("rest", seed, stream), epoch=cycle,',
        'seed=derive_seed("rest", seed, stream), epoch=epoch,',
        (
            "tests/reader/plan/test_mix.py::test_every_sample_once_per_cycle_over_consecutive_epochs",
            "tests/reader/plan/test_mix.py::test_the_issue_example_523_samples_at_300_an_epoch",
        ),
    ),
    M(
        "M63",
        "a single sample larger than the shard-size bound gets a shard of its own (never an empty shard)",
        "convert/write/plan.py",
        "limit is not None and count and current_bytes + size > limit",
        "limit is not None and current_bytes + size > limit",
        (
            "tests/convert/test_roundtrip.py::test_shard_size_bound",
            "tests/convert/write/test_shard_bound.py",
            "tests/audit/test_promises_convert.py",
        ),
    ),
    M(
        "M64",
        "--samples-per-shard N puts at most N samples in a shard",
        "convert/write/plan.py",
        "(per_shard is not None and count >= per_shard)",
        "(per_shard is not None and count > per_shard)",
        ("tests/convert/write/test_shard_bound.py", "tests/convert/test_roundtrip.py"),
    ),
    M(
        "M65",
        "ShardWriter: a sample larger than the bound gets a shard of its own",
        "convert/write/shardstream.py",
        "        if self.samples == 0:\n            return True\n",
        "",
        (
            "tests/convert/pyapi/test_pywriter.py::test_shards_are_cut_at_the_size_bound",
            "tests/audit/test_promises_convert.py",
        ),
        "cutting a shard that holds no sample writes nothing (ShardStream.close_shard returns None), so the big "
        "sample still lands alone in the next shard: the shortcut saves a call, it is not the guarantee",
    ),
    M(
        "M66",
        "the split index is copied to {split}.json, the file wids opens",
        "convert/write/finish.py",
        "        fs.write_atomic(index_name(split), json_bytes(index.to_json()))\n",
        "        pass\n",
        ("tests/convert/pyapi/test_pywriter.py::test_wids_opens_the_split",),
    ),
    M(
        "M67",
        "a rerun after an interruption reuses the finished shards (checked against their records)",
        "convert/write/session.py",
        "            return (result, record) if shard_matches(self.fs, result) else None",
        "            return None",
        (
            "tests/convert/write/test_resume.py::test_sigkill_then_rerun_is_byte_identical",
            "tests/convert/write/test_resume.py::test_a_lost_record_costs_only_a_rewrite_of_its_shard",
        ),
    ),
    M(
        "M68",
        "--no-shuffle keeps the input order",
        "convert/write/plan.py",
        "split=options.split, shuffle=options.shuffle)",
        "split=options.split, shuffle=True)",
        ("tests/convert/test_roundtrip.py::test_seed_changes_order_no_shuffle_keeps_it",),
    ),
    M(
        "M69",
        "fields are checked against the split index when the dataset is built (FieldError naming what it holds)",
        "reader/sample/fields.py",
        "                if not set(field_spec(spec, IMAGE_EXTS)) & set(held):",
        "                if False:",
        ("tests/reader/test_dataset.py", "tests/reader/sample/test_fields.py"),
    ),
    M(
        "M70",
        "device decode without CUDA is a DeviceDecodeError saying what is missing",
        "reader/sample/device_prep.py",
        '    if device.type == "cuda" and not torch.cuda.is_available():',
        "    if False:",
        ("tests/reader/sample/test_device_decode.py::test_no_cuda_is_a_clear_error",),
    ),
    M(
        "M71",
        "shardify verify/info apply the manifest's index check (split, version, shards, digest), as the reader does",
        "convert/dataset_files.py",
        "        return self.manifest.split_index(split, self.files.read_bytes(name), source=self.files.where(name))\n",
        "        return SplitIndex.from_json(self.files.read_json(name), source=self.files.where(name))\n",
        ("tests/audit/test_promises_format.py::test_verify_and_info_check_the_index_version_too",),
    ),
    M(
        "M72",
        "a shard cut short after its scan is damage of the sample being read",
        "reader/io/shardfile.py",
        "    if len(data) != size:  # the file shrank since it was scanned",
        "    if False:",
        ("tests/reader/io/test_stream.py",),
    ),
    M(
        "M73",
        "a .tgz whose gzip CRC fails is damage (the reader reads on to the gzip trailer)",
        "shardify/tarmembers.py",
        "            if _read_to_end_needed(f):\n                read_to_end(f, shard=shard)",
        "            if False:\n                read_to_end(f, shard=shard)",
        ("tests/reader/io/test_stream.py::test_a_gzip_shard_with_a_bad_crc_is_damage",),
    ),
    M(
        "M74",
        "device decode runs in a thread of its own, ahead of the batch the training loop holds",
        "reader/delivery/prefetch.py",
        "self._items = self._decoded() if self._decode is not None else self._moved()",
        "self._items = self._moved()",
        ("tests/reader/delivery/test_prefetch.py",),
    ),
    M(
        "M75",
        "under device decode, map= (which would see undecoded images) is refused when the dataset is made",
        "reader/sample/device_prep.py",
        "    if options.map is not None or any(s.map is not None for s in streams):",
        "    if False:",
        (
            "tests/reader/sample/test_device_decode.py::test_what_would_see_undecoded_images_is_refused_when_the_dataset_is_made",
        ),
    ),
    M(
        "M76",
        "under device decode, the columns other than images are collated as on the CPU path",
        "reader/sample/device_prep.py",
        "        out.append(packed if packed is not None else default_collate(column, empty=empty))",
        "        out.append(packed if packed is not None else list(column))",
        ("tests/reader/sample/test_device_decode.py::test_the_pipeline_gives_the_cpu_paths_batches",),
    ),
    M(
        "M77",
        "under device decode, a custom collate_fn (which would see undecoded images) is refused",
        "reader/sample/device_prep.py",
        "    if collate_fn is not None and collate_fn is not default_collate:",
        "    if False:",
        (
            "tests/reader/sample/test_device_decode.py::test_what_would_see_undecoded_images_is_refused_when_the_dataset_is_made",
        ),
    ),
    M(
        "M78",
        "a worker resumed at batch k skips exactly the samples of its first k batches (each stage skips itself)",
        "reader/stages/batch.py",
        "        skip_source(self.source, sum(self.sizes[:n]))",
        "        skip_source(self.source, n)",
        ("tests/reader/stages/test_chain.py",),
    ),
)


def problems(mutations: tuple[Mutation, ...] = MUTATIONS, *, root: Path = ROOT) -> list[str]:
    """Why each of ``mutations`` would not run as written against the source under ``root``: its
    file missing, its code not found exactly once, or a test it names missing (one line each)."""
    found: list[str] = []
    seen: set[str] = set()
    for m in mutations:
        if m.id in seen:
            found.append(f"{m.id}: the id is used twice")
        seen.add(m.id)
        path = root / m.file
        if not path.is_file():
            found.append(f"{m.id}: {m.file} does not exist")
            continue
        count = path.read_text().count(m.old)
        if count != 1:
            found.append(f"{m.id}: the code to break occurs {count} times in {m.file} (must be once): {m.old!r}")
        if m.old == m.new:
            found.append(f"{m.id}: the mutation changes nothing")
        for test in m.tests:
            file, _, name = test.partition("::")
            if not (root / file).is_file():
                found.append(f"{m.id}: test file {file} does not exist")
            elif name and f"def {name.split('[')[0]}(" not in (root / file).read_text():
                found.append(f"{m.id}: test {test} does not exist")
    return found


def _clean(path: str) -> bool:
    return not subprocess.run(
        ["git", "status", "--porcelain", "--", path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def run(m: Mutation, *, timeout: float, extra: list[str]) -> dict[str, object]:
    """Apply ``m``, run its tests, restore the file; the outcome as a dict."""
    path = ROOT / m.file
    if not _clean(m.file):
        raise SystemExit(f"{m.file} has uncommitted changes: commit or stash them before mutating it")
    text = path.read_text()
    if text.count(m.old) != 1:
        return {"id": m.id, "outcome": f"not applied: the code to break occurs {text.count(m.old)} times"}
    began = time.monotonic()
    try:
        path.write_text(text.replace(m.old, m.new))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *extra, *m.tests]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        except subprocess.TimeoutExpired:
            rc, tail = -1, ["timed out"]
    finally:
        subprocess.run(["git", "checkout", "--", m.file], cwd=ROOT, check=True)
    outcome = {1: "caught", 0: "SURVIVED"}.get(rc, f"error (pytest exit {rc})")
    return {"id": m.id, "outcome": outcome, "seconds": round(time.monotonic() - began, 1), "tail": tail}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests")
    parser.add_argument("--check", action="store_true", help="only check that every mutation applies (no tests run)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutation's tests")
    parser.add_argument("--tests", nargs="*", default=None, help="run these tests instead of the listed ones")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.ids) - {m.id for m in MUTATIONS})
    if unknown:
        parser.error(f"no mutation {', '.join(unknown)} (see --list)")
    chosen = [m for m in MUTATIONS if not args.ids or m.id in args.ids]
    if args.list:
        for m in chosen:
            print(f"{m.id}  {m.file}  {m.promise}\n      {' '.join(m.tests)}")
        return 0
    broken = problems(tuple(chosen))
    if broken:
        print("\n".join(broken), file=sys.stderr)
        print(f"{len(broken)} problem(s): re-key these mutations on the current code; nothing was run", file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(chosen)} mutations apply to the current source, each exactly once")
        return 0
    survived = 0
    for m in chosen:
        if args.tests is not None:
            m = dataclasses.replace(m, tests=tuple(args.tests))
        result = run(m, timeout=args.timeout, extra=[])
        if m.equivalent:
            result["equivalent"] = m.equivalent
        survived += result["outcome"] != "caught" and not m.equivalent
        print(json.dumps(result), flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference trainer takes an `s3://` checkpoint directory for sync and async saves: its arguments become
an object-storage location with a stage directory of its own (the CLI on a real SeaweedFS:
tests/integration/test_s3_cli.py)."""


def test_the_reference_trainer_takes_sync_and_async_saves_to_s3() -> None:
    from ftrain.examples.train import parse_args
    from ftrain.train.checkpointing import make_config

    for extra in ([], ["--async-ckpt"]):
        args = parse_args(["--ckpt-dir", "s3://bucket/ckpt/run", *extra])
        config = make_config(args.ckpt_dir, async_save=args.async_ckpt, env={})
        assert (config.location.backend, config.location.uri) == ("s3", "s3://bucket/ckpt/run")
        assert config.stage_dir.is_absolute() and config.async_save == bool(extra)

"""Runs one of verl's GSM8K preprocessing scripts, unchanged, on local GSM8K JSONL files.

The Parquet files beside this script were made with it: they are what verl itself writes, so the tests can
hold `rlstream preprocess gsm8k` to them column for column. Needs `pip install datasets` and a checkout of
verl (https://github.com/volcengine/verl); verl itself is not imported (its package pulls in torch), only the
two names the scripts import from it are stood in for, and `datasets.load_dataset` is pointed at local files.

  python3 verl-rows.py VERL_CHECKOUT/examples/data_preprocess/gsm8k_tool_agent_loop.py RAW_DIR OUT_DIR
"""
import runpy
import sys
import types

import datasets

script, raw_dir, out_dir = sys.argv[1:4]

# The scripts import copy/makedirs for an optional HDFS upload that is not used here.
hdfs_io = types.ModuleType("verl.utils.hdfs_io")
hdfs_io.copy = hdfs_io.makedirs = lambda *a, **k: None
for name in ("verl", "verl.utils"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["verl.utils.hdfs_io"] = hdfs_io


def load_local(path, name=None, **kwargs):
    # openai/gsm8k's "main" config: the train and test splits as {question, answer} records.
    return datasets.DatasetDict(
        {split: datasets.Dataset.from_json(f"{raw_dir}/{split}.jsonl") for split in ("train", "test")}
    )


datasets.load_dataset = load_local
sys.argv = [script, "--local_save_dir", out_dir]
runpy.run_path(script, run_name="__main__")

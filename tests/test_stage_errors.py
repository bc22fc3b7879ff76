import subprocess
import sys

import yaml

from storyrewrite.params import load_yaml

from helpers import ROOT


def test_a_stage_reports_bad_params_in_one_line_and_exits_2(tmp_path):
    params = load_yaml(ROOT / "params.yaml")
    params["data"]["max_train"] = "many"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run([sys.executable, str(ROOT / "stages" / "prepare.py"), "--raw", "raw", "--out", "out",
                             "--counts", "counts.json"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: params: `data.max_train` = 'many': Input should be a valid integer, unable to parse "
                                     "string as an integer")
    assert not (tmp_path / "out").exists()

package predictions_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/predictions"
)

func write(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "preds.jsonl")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRead(t *testing.T) {
	ps, err := predictions.Read(write(t, `{"instance_id":"a","model_name_or_path":"m","model_patch":"diff"}

{"instance_id":"b","model_name_or_path":"m","model_patch":""}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Patch != "diff" || ps[1].InstanceID != "b" {
		t.Errorf("Read() = %+v", ps)
	}
}

func TestReadNamesEveryBadLine(t *testing.T) {
	_, err := predictions.Read(write(t, `{"instance_id":"a","model_name_or_path":"m","model_patch":""}
not json
{"model_name_or_path":"m"}
{"instance_id":"a","model_name_or_path":"m","model_patch":"again"}
`))
	if err == nil {
		t.Fatal("Read() error = nil")
	}
	for _, want := range []string{"preds.jsonl:2: not a JSON object", "preds.jsonl:3: instance_id: is required", "preds.jsonl:4: instance_id: a already has a prediction from m on line 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

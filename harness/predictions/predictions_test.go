package predictions_test

import (
	"os"
	"path/filepath"
	"runtime"
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

func TestReadRefusesBadInputNamingFileLineAndField(t *testing.T) {
	cases := []struct {
		name, line, want string
	}{
		{"missing model_patch", `{"instance_id":"a","model_name_or_path":"m"}`, ":1: model_patch: is required"},
		{"misspelled model_patch", `{"instance_id":"a","model_name_or_path":"m","model_pach":"x"}`, `:1: model_pach: json: unknown field "model_pach"`},
		{"patch of the wrong type", `{"instance_id":"a","model_name_or_path":"m","model_patch":7}`, ":1: model_patch:"},
		{"invalid UTF-8", "{\"instance_id\":\"a\",\"model_name_or_path\":\"m\",\"model_patch\":\"\xff\"}", ":1: not valid UTF-8 (at byte 60)"},
		{"lone surrogate escape", `{"instance_id":"a","model_name_or_path":"m","model_patch":"x\udc80y"}`, ":1: model_patch: holds an unpaired UTF-16 surrogate"},
		{"model named ..", `{"instance_id":"a","model_name_or_path":"..","model_patch":""}`, `:1: model_name_or_path: ".." has an empty, "." or ".." path part`},
		{"model climbing out", `{"instance_id":"a","model_name_or_path":"org/../../x","model_patch":""}`, `path part`},
		{"model with a newline", `{"instance_id":"a","model_name_or_path":"m\nx","model_patch":""}`, "control character"},
		{"empty model", `{"instance_id":"a","model_name_or_path":"","model_patch":""}`, "model_name_or_path: is required"},
		{"instance id with a slash", `{"instance_id":"../a","model_name_or_path":"m","model_patch":""}`, "instance_id: must match"},
		{"not an object", `["a"]`, ":1: not a JSON object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := predictions.Read(write(t, c.line+"\n"))
			if err == nil || !strings.Contains(err.Error(), "preds.jsonl"+c.want) && !strings.Contains(err.Error(), c.want) {
				t.Errorf("Read() error = %v, want one containing %q", err, c.want)
			}
		})
	}
	// A valid surrogate pair is text.
	ps, err := predictions.Read(write(t, `{"instance_id":"a","model_name_or_path":"m","model_patch":"\ud83d\ude00"}`+"\n"))
	if err != nil || ps[0].Patch != "\U0001F600" {
		t.Errorf("a surrogate pair: %v %+v", err, ps)
	}
}

// TestReadRefusesAHugeLineWithoutHoldingIt: a line over the limit is an error naming its line,
// read through in chunks: what reading allocates does not grow with the line's length.
func TestReadRefusesAHugeLineWithoutHoldingIt(t *testing.T) {
	alloc := func(extraMiB int) uint64 {
		path := filepath.Join(t.TempDir(), "preds.jsonl")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(`{"instance_id":"a","model_name_or_path":"m","model_patch":""}` + "\n")
		f.WriteString(`{"instance_id":"b","model_name_or_path":"m","model_patch":"`)
		chunk := strings.Repeat("+", 1<<20)
		for i := 0; i < (predictions.MaxLineBytes>>20)+extraMiB; i++ {
			f.WriteString(chunk)
		}
		f.WriteString("\"}\n")
		f.Close()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err = predictions.Read(path)
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), "preds.jsonl:2: the line is") {
			t.Fatalf("Read() error = %v, want line 2 refused for its size", err)
		}
		return after.TotalAlloc - before.TotalAlloc
	}
	short, long := alloc(8), alloc(8+128)
	if long > short+short/4 {
		t.Errorf("reading allocated %d MiB for a line 128 MiB longer, %d MiB for the shorter: memory grows with the line", long>>20, short>>20)
	}
}

func TestFolderIsOneToOne(t *testing.T) {
	names := []string{"a/b", "a_b", "a%2Fb", "org/model-1.5", "a b", "ü"}
	seen := map[string]string{}
	for _, n := range names {
		f := predictions.Folder(n)
		if prev, dup := seen[f]; dup {
			t.Errorf("Folder(%q) = Folder(%q) = %q", n, prev, f)
		}
		if strings.ContainsAny(f, "/\\") || f == "." || f == ".." || f == "" {
			t.Errorf("Folder(%q) = %q is not one plain folder name", n, f)
		}
		seen[f] = n
	}
}

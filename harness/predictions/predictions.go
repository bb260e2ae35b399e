// Package predictions owns reading submissions: JSON Lines files with SWE-bench's field names
// (instance_id, model_name_or_path, model_patch), checked line by line.
package predictions

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/infradev/infradev/harness/specfile"
)

// Prediction is one model's patch for one task instance.
type Prediction struct {
	InstanceID string `json:"instance_id"`
	Model      string `json:"model_name_or_path"`
	Patch      string `json:"model_patch"`
}

// Read reads a predictions file. Every bad line is reported with its number; a model that
// submits twice for one instance is an error.
func Read(file string) ([]Prediction, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []Prediction
	var errs specfile.Errors
	seen := map[[2]string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 512<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var p Prediction
		dec := json.NewDecoder(strings.NewReader(text))
		if err := dec.Decode(&p); err != nil {
			errs = append(errs, specfile.FieldError{File: file, Line: line, Msg: "not a JSON object: " + err.Error()})
			continue
		}
		if p.InstanceID == "" {
			errs = append(errs, specfile.FieldError{File: file, Line: line, Field: "instance_id", Msg: "is required"})
		}
		if p.Model == "" {
			errs = append(errs, specfile.FieldError{File: file, Line: line, Field: "model_name_or_path", Msg: "is required"})
		}
		key := [2]string{p.Model, p.InstanceID}
		if first, dup := seen[key]; dup {
			errs = append(errs, specfile.FieldError{File: file, Line: line, Field: "instance_id",
				Msg: fmt.Sprintf("%s already has a prediction from %s on line %d", p.InstanceID, p.Model, first)})
		}
		seen[key] = line
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

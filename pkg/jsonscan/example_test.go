package jsonscan_test

import (
	"fmt"

	"github.com/kvroute/kvroute/pkg/jsonscan"
)

// A body is validated once; its members are then read without validating
// them again.
func Example() {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"caf\u00e9\n"}]}`)
	if !jsonscan.Valid(body) {
		fmt.Println("not JSON")
		return
	}
	members, err := jsonscan.SplitObject(body)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, msg := range jsonscan.SplitArray(members["messages"]) {
		fields, _ := jsonscan.SplitObject(msg)
		content, _ := jsonscan.DecodeString(fields["content"])
		fmt.Printf("%q\n", content)
	}
	// Output: "café\n"
}

package tokenizer

import "strings"

// Message is one turn of a chat, as chat-formatted data sets (verl's
// parquet layout, OpenAI-style JSON) store prompts.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatML renders messages in the ChatML layout of Qwen models and of keel's
// own tokenizer: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then,
// with addGenerationPrompt, "<|im_start|>assistant\n" for the model to
// continue. A response ends with <|im_end|>.
func ChatML(msgs []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(ImStart)
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString(ImEnd)
		b.WriteByte('\n')
	}
	if addGenerationPrompt {
		b.WriteString(ImStart)
		b.WriteString("assistant\n")
	}
	return b.String()
}

// UserPrompt is the ChatML prompt of a single user message, ready for the
// assistant's answer.
func UserPrompt(content string) string {
	return ChatML([]Message{{Role: "user", Content: content}}, true)
}

// EncodeChat returns the ids of msgs in the ChatML layout (ChatML), with
// the generation prompt if addGenerationPrompt: what Hugging Face's
// apply_chat_template with tokenize=True gives for Qwen's ChatML.
func (t *Tokenizer) EncodeChat(msgs []Message, addGenerationPrompt bool) []int32 {
	return t.Encode(ChatML(msgs, addGenerationPrompt))
}

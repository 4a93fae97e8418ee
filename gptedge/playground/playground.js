// The gptedge playground: one ES module, no build step. It runs a packed model dir (`gptedge pack --target web`)
// with transformers.js on onnxruntime-web (WASM) "in this browser", or asks `gptedge serve`'s /v1/completions
// "on the server". The same module runs in Node (transformers.js on onnxruntime-node): the tests and the
// benchmark call loadModel / generateLocal exactly as the page does.
//
// '@huggingface/transformers' is a bare import: in the page an import map points it (and the two bare imports of
// transformers.js's web build) at the vendored files; in Node it resolves to node_modules beside this file.
// Imported on first use, so the page's "on the server" mode works where the vendored files are missing.
let transformersModule = null;
async function tf() {
  transformersModule ??= await import('@huggingface/transformers');
  return transformersModule;
}

const IS_BROWSER = typeof window !== 'undefined' && typeof document !== 'undefined';
// A packed dir's gptedge-pack.json says which transformers.js dtypes (graphs) it holds.
export const PACK_MANIFEST = 'gptedge-pack.json';
// ... and gptedge-selftest.json the Python runtime's golden greedy ids and top logits, replayed at load.
export const SELFTEST_FILE = 'gptedge-selftest.json';
// gptedge's text never "cleans up" spaces before punctuation: keep transformers.js' decode the same.
const DECODE = { skip_special_tokens: true, clean_up_tokenization_spaces: false };

/** WASM settings: the dir holding onnxruntime-web's .wasm (never a CDN) and the thread count (threads need
 * cross-origin isolation, which `gptedge serve` gives; a plain static server gets one thread). */
export async function configureRuntime({ wasmPaths = null, threads = null } = {}) {
  const { env } = await tf();
  env.allowRemoteModels = false;
  env.allowLocalModels = true;
  const wasm = env.backends?.onnx?.wasm;
  if (wasm) {
    if (wasmPaths) wasm.wasmPaths = wasmPaths;
    const isolated = !IS_BROWSER || globalThis.crossOriginIsolated === true;
    const cores = globalThis.navigator?.hardwareConcurrency ?? 1;
    wasm.numThreads = threads ?? (isolated ? Math.max(1, Math.min(cores, 4)) : 1);
    wasm.proxy = false;
  }
  return { threads: wasm?.numThreads ?? null };
}

/** A JSON file of a packed dir (a URL in the page, a path in Node). */
async function readPackFile(base, name) {
  const url = `${String(base).replace(/\/+$/, '')}/${name}`;
  if (IS_BROWSER || /^https?:/.test(url)) {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return response.json();
  }
  const { readFile } = await import('node:fs/promises');
  return JSON.parse(await readFile(url, 'utf8'));
}

/** gptedge-pack.json of a packed dir: its dtypes (one onnx/model*.onnx each) and the recommended one. */
export async function readPack(base) {
  return readPackFile(base, PACK_MANIFEST);
}

/** gptedge-selftest.json of a packed dir: each graph's golden cases (gptedge/pack/selftest.py). */
export async function readSelfTest(base) {
  return readPackFile(base, SELFTEST_FILE);
}

/** Load the tokenizer and one dtype's graph of a packed dir (a URL in the page, a path in Node). */
export async function loadModel(base, { dtype = null, device = null, onProgress = null } = {}) {
  // transformers.js reads a local model from a path, not a URL (its file checks skip http: ones): in the page, the
  // folder's path on this origin; in Node, an absolute path. Either starts with '/', so transformers.js never
  // takes it for a Hub id (it would put env.localModelPath in front of one).
  if (IS_BROWSER) {
    base = new URL(base, location.href).pathname;
  } else {
    const { resolve } = await import('node:path');
    base = resolve(String(base));
  }
  let chosen = dtype, pack = null;
  if (!chosen) {  // the packed folder's recommended graph (a folder another tool wrote needs an explicit dtype)
    pack = await readPack(base);
    chosen = pack.recommended ?? pack.models[0].dtype;
  }
  const { AutoModelForCausalLM, AutoTokenizer } = await tf();
  const name = String(base).replace(/\/+$/, '') || '/';
  const t0 = performance.now();
  const options = { local_files_only: true, progress_callback: onProgress ?? undefined };
  const tokenizer = await AutoTokenizer.from_pretrained(name, options);
  const model = await AutoModelForCausalLM.from_pretrained(name, {
    ...options, dtype: chosen, device: device ?? (IS_BROWSER ? 'wasm' : 'cpu'),
  });
  return { tokenizer, model, dtype: chosen, pack, loadMs: performance.now() - t0 };
}

/** transformers.js' generate options for the playground's sampling settings. */
export function generationOptions({ maxNewTokens = 64, greedy = true, topK = 0, topP = 1.0, temperature = 1.0 } = {}) {
  if (greedy || temperature === 0) return { max_new_tokens: maxNewTokens, do_sample: false };
  return { max_new_tokens: maxNewTokens, do_sample: true, top_k: topK, top_p: topP, temperature };
}

/** Continue `prompt` (text, or token ids) locally; `onText(piece)` gets the text as it completes. -> ids (new
 * tokens, eos kept as gptedge keeps it), text, and timings: first token ms (prompt in, first id out) and decode
 * tok/s (the tokens after the first over the time from the first to the last, as gptedge's
 * Generation.tokens_per_s). `settings.minNewTokens` holds eos back that long (benchmarks: a fixed length). */
export async function generateLocal(loaded, prompt, settings = {}, onText = null, stopper = null) {
  const { tokenizer, model } = loaded;
  const { TextStreamer, Tensor } = await tf();
  let inputs;
  if (Array.isArray(prompt)) {
    const ids = BigInt64Array.from(prompt, BigInt);
    inputs = { input_ids: new Tensor('int64', ids, [1, ids.length]),
      attention_mask: new Tensor('int64', new BigInt64Array(ids.length).fill(1n), [1, ids.length]) };
  } else {
    inputs = tokenizer(prompt);
  }
  const stamps = [];
  const streamer = new TextStreamer(tokenizer, {
    skip_prompt: true, ...DECODE,
    callback_function: (piece) => { if (piece && onText) onText(piece); },
    token_callback_function: () => stamps.push(performance.now()),
  });
  const t0 = performance.now();
  const extra = stopper ? { stopping_criteria: [stopper] } : {};
  if (settings.minNewTokens) extra.min_new_tokens = settings.minNewTokens;
  const output = await model.generate({ ...inputs, ...generationOptions(settings), streamer, ...extra });
  const promptTokens = inputs.input_ids.dims[1];
  const ids = Array.from(output.tolist()[0], Number).slice(promptTokens);
  const n = stamps.length;
  return {
    ids,
    text: tokenizer.decode(ids, DECODE),
    promptTokens,
    firstTokenMs: n ? stamps[0] - t0 : null,
    decodeTokPerS: n > 1 ? (n - 1) / ((stamps[n - 1] - stamps[0]) / 1000) : null,
    totalMs: performance.now() - t0,
  };
}

/** Replay the pack's golden self-test on this device (gptedge/pack/selftest.py says what it holds): each case
 * teacher-forced in one forward run over prompt_ids + ids[:-1] -> logits (1, P + N - 1, V); at step s (position
 * P - 1 + s) the recorded top-k logits against this device's at the same ids, and its argmax against ids[s] (a step
 * whose recorded top two lie within twice the tolerance may pick either). -> { pass, maxDelta, tolerance, flips,
 * caveat, dtype } (pass false with `reason` when the file has no cases for this graph). */
export async function runSelfTest(loaded, selftest) {
  const graph = selftest?.graphs?.find((g) => g.dtype === loaded.dtype);
  if (!graph) return { pass: false, maxDelta: null, reason: `no golden cases for ${loaded.dtype}`, flips: [] };
  const { Tensor } = await tf();
  let maxDelta = 0;
  const flips = [];
  for (const c of graph.cases) {
    const sequence = [...c.prompt_ids, ...c.ids.slice(0, -1)];
    const n = sequence.length;
    const { logits } = await loaded.model({
      input_ids: new Tensor('int64', BigInt64Array.from(sequence, BigInt), [1, n]),
      attention_mask: new Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]),
    });
    const [vocab, data] = [logits.dims[2], logits.data];
    c.top.forEach((top, step) => {
      const row = (c.prompt_ids.length - 1 + step) * vocab;
      for (const [id, value] of top) maxDelta = Math.max(maxDelta, Math.abs(data[row + id] - value));
      let best = 0;
      for (let v = 1; v < vocab; v++) if (data[row + v] > data[row + best]) best = v;
      const tie = top.length > 1 && top[0][1] - top[1][1] <= 2 * graph.tolerance;
      if (best !== c.ids[step] && !tie) flips.push({ prompt: c.prompt, step, want: c.ids[step], got: best });
    });
    logits.dispose?.();
  }
  // NaN never passes: a comparison with it is false
  const pass = maxDelta <= graph.tolerance && flips.length === 0;
  return { pass, maxDelta, tolerance: graph.tolerance, flips, caveat: graph.caveat ?? null, dtype: loaded.dtype };
}

/** "self-test: pass (max |Δlogit| = 3.1e-5, tolerance 0.01)", or fail with what differs. */
export function formatSelfTest(result) {
  if (result.maxDelta === null) return `self-test: fail (${result.reason})`;
  const delta = `max |Δlogit| = ${result.maxDelta.toExponential(1)}`;
  if (result.pass) return `self-test: pass (${delta}, tolerance ${result.tolerance})`;
  const parts = [result.maxDelta > result.tolerance || Number.isNaN(result.maxDelta)
    ? `${delta} > tolerance ${result.tolerance}` : `${delta}`];
  if (result.flips.length) parts.push(`${result.flips.length} greedy id${result.flips.length === 1 ? '' : 's'} differ`);
  return `self-test: fail (${parts.join('; ')})${result.caveat ? ` — ${result.caveat}` : ''}`;
}

/** The chat's prompt ids, rendered in this browser by transformers.js from the pack's chat template
 * (tokenizer_config.json's chat_template) and tokenized without adding special tokens, as the server does. */
export function chatPromptIds(loaded, messages) {
  return Array.from(loaded.tokenizer.apply_chat_template(messages, {
    add_generation_prompt: true, tokenize: true, return_tensor: false, return_dict: false,
  }), Number);
}

/** One chat turn locally: the conversation's ids, then generateLocal. */
export async function chatLocal(loaded, messages, settings = {}, onText = null, stopper = null) {
  return generateLocal(loaded, chatPromptIds(loaded, messages), settings, onText, stopper);
}

/** POST `body` to a streaming route of `gptedge serve` and read its server-sent events; `pieceOf(chunk)` is the
 * text of one chunk, `onText(piece)` gets each. -> text, tokens (usage) and timings. */
async function streamFromServer(server, url, body, pieceOf, onText = null, signal = undefined) {
  const headers = { 'Content-Type': 'application/json' };
  if (server.apiKey) headers.Authorization = `Bearer ${server.apiKey}`;
  const t0 = performance.now();
  const response = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body), signal });
  if (!response.ok) {
    const error = await response.json().catch(() => ({}));
    throw new Error(error?.error?.message ?? `HTTP ${response.status}`);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '', text = '', first = null, last = null, tokens = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.replace(/^data: /, '');
      if (data === '[DONE]') continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      const piece = pieceOf(chunk) ?? '';
      if (piece) {
        last = performance.now();
        first ??= last;
        text += piece;
        if (onText) onText(piece);
      }
    }
  }
  return { text, tokens, firstTokenMs: first === null ? null : first - t0,
    decodeTokPerS: tokens > 1 && last > first ? (tokens - 1) / ((last - first) / 1000) : null,
    totalMs: performance.now() - t0 };
}

function samplingBody(settings) {
  const { maxNewTokens = 64, greedy = true, topK = 0, topP = 1.0, temperature = 1.0 } = settings;
  const body = { max_tokens: maxNewTokens, stream: true, stream_options: { include_usage: true },
    temperature: greedy ? 0 : temperature };
  if (!greedy) Object.assign(body, { top_k: topK, top_p: topP });
  return body;
}

/** Stream a completion from `gptedge serve`'s /v1/completions (SSE); `onText(piece)` gets each piece. */
export async function generateOnServer(server, prompt, settings = {}, onText = null, signal = undefined) {
  return streamFromServer(server, server.completions, { model: server.model, prompt, ...samplingBody(settings) },
    (chunk) => chunk.choices?.[0]?.text, onText, signal);
}

/** Stream one chat turn from `gptedge serve`'s /v1/chat/completions: `messages` is the whole conversation (the
 * server renders it with the model's chat template); `onText(piece)` gets each piece of the reply. */
export async function chatOnServer(server, messages, settings = {}, onText = null, signal = undefined) {
  return streamFromServer(server, server.chat, { model: server.model, messages, ...samplingBody(settings) },
    (chunk) => chunk.choices?.[0]?.delta?.content, onText, signal);
}

// ---------------------------------------------------------------------------------------------------------------
// The page. Everything below touches the DOM only when mount() is called (index.html does).

function formatStats(result, where) {
  const parts = [];
  if (result.tokens ?? result.ids) parts.push(`${result.tokens ?? result.ids.length} tokens`);
  if (result.firstTokenMs !== null) parts.push(`first token ${result.firstTokenMs.toFixed(0)} ms`);
  if (result.decodeTokPerS !== null) parts.push(`${result.decodeTokPerS.toFixed(1)} tok/s`);
  return `${parts.join(' · ')} — ${where}`;
}

/** Wire the page: mode, sampling settings, generate / stop, streaming output and tok/s; the chat (a message list
 * kept here, sent whole each turn) where the model has a chat template; the self-test when a graph loads. */
export async function mount(doc, { config = 'playground.json' } = {}) {
  const $ = (id) => doc.getElementById(id);
  const output = $('output'), status = $('status'), go = $('generate'), send = $('send');
  const settings = await (await fetch(config)).json();
  const params = new URLSearchParams(location.search);
  let runtime = null;
  const ensureRuntime = async () => {
    runtime ??= await configureRuntime({ wasmPaths: new URL('vendor/onnxruntime-web/dist/', location.href).href,
      threads: params.has('threads') ? Number(params.get('threads')) : null });
    return runtime;
  };
  $('title').textContent = settings.title ?? 'gptedge playground';
  const modes = { server: $('mode-server'), browser: $('mode-browser') };
  modes.server.disabled = !settings.server;
  modes.browser.disabled = !settings.browser?.model;
  $('browser-note').textContent = settings.browser?.model ? '' : (settings.browser?.unavailable ?? '');
  (settings.server ? modes.server : modes.browser).checked = true;
  if (params.get('mode') && modes[params.get('mode')] && !modes[params.get('mode')].disabled) {
    modes[params.get('mode')].checked = true;
  }
  $('api-key-row').hidden = !settings.server?.api_key_required;
  const dtypeSelect = $('dtype');
  const modelUrl = settings.browser?.model ? new URL(settings.browser.model, location.href).href : null;
  let pack = null;
  if (modelUrl) {
    pack = await readPack(modelUrl);
    for (const m of pack.models) {
      const option = doc.createElement('option');
      option.value = m.dtype;
      option.textContent = `${m.dtype} — ${m.recipe} (${(m.bytes / 1e6).toFixed(1)} MB)`;
      dtypeSelect.append(option);
    }
    dtypeSelect.value = params.get('dtype') ?? pack.recommended;
  }
  const loaded = new Map();
  let controller = null, stopper = null, selftest;

  const read = () => ({
    maxNewTokens: Number($('max-tokens').value), greedy: $('sampling').value === 'greedy',
    topK: $('sampling').value === 'top-k' ? Number($('top-k').value) : 0,
    topP: $('sampling').value === 'top-p' ? Number($('top-p').value) : 1.0,
    temperature: Number($('temperature').value),
  });
  const show = (piece) => { output.textContent += piece; };
  const server = () => ({ ...settings.server, apiKey: $('api-key').value || null });
  const browserWhere = (dtype) =>
    `in this browser (WASM, ${runtime.threads} thread${runtime.threads === 1 ? '' : 's'}, ${dtype})`;

  // A graph loads once; the pack's golden self-test runs on it then, and its verdict stays on the page.
  const ensureLoaded = async () => {
    const dtype = dtypeSelect.value;
    await ensureRuntime();
    stopper ??= new (await tf()).InterruptableStoppingCriteria();
    if (!loaded.has(dtype)) {
      status.textContent = `downloading and loading ${dtype} …`;
      const model = await loadModel(modelUrl, { dtype });
      loaded.set(dtype, model);
      const line = $('selftest');
      line.dataset.state = 'running';
      line.textContent = `self-test of ${dtype} …`;
      selftest ??= await readSelfTest(modelUrl).catch(() => null);
      if (selftest === null) {
        line.textContent = `self-test: none (this pack has no ${SELFTEST_FILE})`;
        line.dataset.state = 'none';
      } else {
        const result = await runSelfTest(model, selftest);
        line.textContent = `${dtype} ${formatSelfTest(result)}`;
        line.dataset.state = result.pass ? 'pass' : 'fail';
      }
      status.textContent = `${dtype} loaded`;
    }
    return loaded.get(dtype);
  };

  // Chat: the server's /v1/chat/completions where the served model has a template; in this browser where the
  // pack's tokenizer_config.json has one (transformers.js renders it).
  const chatUnavailable = () => {
    if (modes.server.checked) return settings.server?.chat ? null : (settings.server?.chat_unavailable ?? 'no chat');
    return pack?.chat_template ? null : 'the packed model has no chat template';
  };
  const tasks = { complete: $('task-complete'), chat: $('task-chat') };
  const showTask = () => {
    const why = chatUnavailable();
    tasks.chat.disabled = why !== null;
    if (why !== null && tasks.chat.checked) tasks.complete.checked = true;
    $('chat-note').textContent = why ?? '';
    $('chat-panel').hidden = !tasks.chat.checked;
    $('complete-panel').hidden = tasks.chat.checked;
  };
  for (const input of [...Object.values(modes), ...Object.values(tasks)]) input.addEventListener('change', showTask);
  if (params.get('task') === 'chat') tasks.chat.checked = true;
  showTask();

  const history = [];  // the conversation's user and assistant turns; the system prompt is read at each send
  const messages = $('messages');
  const addMessage = (role, text) => {
    const div = doc.createElement('div');
    div.className = 'message';
    div.dataset.role = role;
    div.textContent = text;
    messages.append(div);
    return div;
  };

  const run = async (button, target, work) => {
    button.disabled = true;
    target.dataset.state = 'running';
    try {
      const { result, where } = await work();
      status.textContent = formatStats(result, where);
      target.dataset.state = 'done';
    } catch (error) {
      status.textContent = `Error: ${error.message ?? error}`;
      target.dataset.state = 'error';
    } finally {
      button.disabled = false;
      controller = null;
    }
  };

  go.addEventListener('click', () => {
    output.textContent = '';
    const prompt = $('prompt').value;
    return run(go, output, async () => {
      let result, where;
      if (modes.server.checked) {
        controller = new AbortController();
        status.textContent = 'generating on the server …';
        result = await generateOnServer(server(), prompt, read(), show, controller.signal);
        where = `on the server (${settings.server.model})`;
      } else {
        const model = await ensureLoaded();
        status.textContent = 'generating in this browser …';
        stopper.reset();
        result = await generateLocal(model, prompt, read(), show, stopper);
        where = browserWhere(model.dtype);
      }
      output.textContent = result.text;  // the whole decode: what gptedge's runtime prints
      return { result, where };
    });
  });

  send.addEventListener('click', () => {
    const text = $('chat-input').value;
    if (!text.trim()) return undefined;
    const system = $('system').value;
    const turn = { role: 'user', content: text };
    const conversation = [...(system.trim() ? [{ role: 'system', content: system }] : []), ...history, turn];
    addMessage('user', text);
    $('chat-input').value = '';
    const reply = addMessage('assistant', '');
    const piece = (p) => { reply.textContent += p; };
    return run(send, messages, async () => {
      let result, where;
      try {
        if (modes.server.checked) {
          controller = new AbortController();
          status.textContent = 'replying on the server …';
          result = await chatOnServer(server(), conversation, read(), piece, controller.signal);
          where = `on the server (${settings.server.model})`;
        } else {
          const model = await ensureLoaded();
          status.textContent = 'replying in this browser …';
          stopper.reset();
          result = await chatLocal(model, conversation, read(), piece, stopper);
          where = browserWhere(model.dtype);
        }
      } catch (error) {  // the turn is not kept: the user may send it again
        reply.remove();
        $('chat-input').value = text;
        messages.lastElementChild?.remove();
        throw error;
      }
      reply.textContent = result.text;
      history.push(turn, { role: 'assistant', content: result.text });
      return { result, where };
    });
  });
  $('clear').addEventListener('click', () => {
    history.length = 0;
    messages.replaceChildren();
    delete messages.dataset.state;
  });

  $('load').disabled = !modelUrl;
  $('load').addEventListener('click', async () => {
    $('load').disabled = true;
    try {
      await ensureLoaded();
    } catch (error) {
      status.textContent = `Error: ${error.message ?? error}`;
    } finally {
      $('load').disabled = false;
    }
  });
  $('stop').addEventListener('click', () => { controller?.abort(); stopper?.interrupt(); });
  $('sampling').addEventListener('change', () => {
    const kind = $('sampling').value;
    $('top-k').disabled = kind !== 'top-k';
    $('top-p').disabled = kind !== 'top-p';
    $('temperature').disabled = kind === 'greedy';
  });
  $('sampling').dispatchEvent(new Event('change'));
  doc.body.dataset.ready = 'true';
}

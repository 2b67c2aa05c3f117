"""Shipping a trained model: its model card, and a GGUF file for llama.cpp, Ollama and LM Studio.

Start reading at ``gguf_export.py`` (``workbench.export`` / ``workbench export RUN --gguf q8_0``):

    card.py           the README.md (huggingface_hub ModelCard) of every saved model folder, written
                      from the run folder: by the engine for model/, best/ and model_merged/, by an
                      evaluation (its eval_results) and by the export
    gguf_export.py    export(): the run's model (merged when LoRA) -> GGUF + Modelfile + card, checked
    gguf_writer.py    the GGUF file itself (gguf package: writer, tensor names, vocabulary, q8_0)
    chat_template.py  a Jinja chat template measured by rendering it: the text around each role
    modelfile.py      the Ollama Modelfile, every value quoted as Ollama's parser reads it
    verify.py         the round trip: the header read back, the file loaded through transformers,
                      logits compared with the source model's

Named ``shipping`` because ``workbench.export`` is the public function.

Imports: ``workbench.errors``, ``workbench.engine`` (the run-folder readers: runs, events,
benchmarks; checkpoint's atomic folder writer), ``workbench.tasks.lora`` (merging an adapter)
and ``workbench.sources.paths``. Never a view. The engine imports ``card.py`` only (it writes the
card of each model folder it saves), and ``card.py`` imports nothing heavy: no torch, no gguf.
"""

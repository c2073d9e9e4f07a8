"""Sanitizer stage: limits, text cleaning, schema validation and secret/PII findings (see gateway.stages.sanitizer.walk)."""

from __future__ import annotations

from audit.canon import digest
from gateway.core.call import BlockClass, CallContext, Decision
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stages.classify import classify_call, merge_classes
from gateway.stages.sanitizer.urls import urls_for
from gateway.stages.sanitizer.walk import SanitizeError, SanitizerLimits, sanitize


class Sanitizer:
    name = "sanitizer"

    def __init__(self) -> None:
        self._limits: dict[int, SanitizerLimits] = {}

    def _limits_for(self, policy: CompiledPolicy) -> SanitizerLimits:
        key = id(policy.sanitizer)
        limits = self._limits.get(key)
        if limits is None:
            s = policy.sanitizer
            limits = SanitizerLimits(
                max_bytes=s.max_bytes, max_depth=s.max_depth, max_string=s.max_string, max_items=s.max_items
            )
            self._limits = {key: limits}
        return limits

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        schema = ctx.tool.input_schema if ctx.tool else None
        try:
            result = sanitize(ctx.call.arguments, self._limits_for(policy), schema)
        except SanitizeError as exc:
            where = f" at {exc.path}" if exc.path and exc.path not in exc.message else ""
            return Decision.block(
                ErrorCode.INVALID_PARAMS,
                f"invalid arguments for {ctx.call.tool}{where}: {exc.message}",
                BlockClass.SAFETY_CONTENT,
                stage=self.name,
            )
        tool = ctx.tool.name if ctx.tool else ctx.call.tool
        from gateway.stages.sanitizer.shell import bash_arguments, shell_for  # its patterns compile on the first call, not at start-up

        references = policy.call_references(tool)
        arguments = bash_arguments(tool, references, ctx.call.arguments, result.arguments)
        ctx.arguments = arguments
        ctx.argument_digest = digest(arguments)
        ctx.findings.extend(result.findings)
        remember = not result.findings  # arguments holding a secret stay out of the memos
        merge_classes(ctx.classes, ctx.class_paths, *classify_call(
            ctx.call.tool, ctx.tool.annotations if ctx.tool else {}, arguments, remember=remember))
        shell = shell_for(tool, arguments, references, remember=remember)
        if shell is not None:  # a shell-like tool: what its command does, for rules and sequences
            ctx.shell = shell
            merge_classes(ctx.classes, ctx.class_paths, shell.classes, shell.class_paths)
        ctx.urls = urls_for(tool, result.arguments, policy.call_references(tool))
        ctx.egress = policy.egress_for(ctx.principal.tier if ctx.principal else None)
        return None

// `rlstream infra up|down|status|setup`: the development services (Kafka, ClickHouse, schema registry) on this
// machine, through the same scripts the test suite uses (infra/*.sh).
import type { Command } from 'commander';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const INFRA = fileURLToPath(new URL('../../infra/', import.meta.url));

function script(name: string): void {
  const res = spawnSync('bash', [`${INFRA}${name}.sh`], { stdio: 'inherit' });
  if (res.error) throw res.error;
  if (res.status !== 0) process.exitCode = res.status ?? 1;
}

export function register(program: Command): void {
  const infra = program.command('infra').description('install, start, stop and inspect the development services (Kafka, ClickHouse, schema registry)');
  infra.command('setup').description('install what is missing (idempotent, cached under .infra/)').action(() => script('setup'));
  infra.command('up').description('start the services and wait until each answers').action(() => script('up'));
  infra.command('down').description('stop the services infra up started').action(() => script('down'));
  infra
    .command('status')
    .description('print each service, its address and whether it answers (exit 1 when one does not)')
    .option('--json', 'print JSON')
    .action((opts: { json?: boolean }) => {
      const res = spawnSync('bash', [`${INFRA}status.sh`], { encoding: 'utf8' });
      if (res.error) throw res.error;
      if (opts.json) {
        const rows = res.stdout
          .trim()
          .split('\n')
          .filter((l) => l)
          .map((l) => {
            const [service, state, address, pid] = l.split('\t');
            return { service, state, address, pid: pid ? Number(pid) : null };
          });
        console.log(JSON.stringify(rows));
      } else {
        process.stdout.write(res.stdout.replaceAll('\t', '  '));
      }
      process.exitCode = res.status ?? 1;
    });
}
